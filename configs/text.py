"""Text classification: a transformer from scratch, a pretrained keras_hub backbone, or
the encoder of your own language model (docs/text_classification.md).

python launch.py --config=configs/text.py --workdir=runs/text     # the standard library's
    # code, each definition labeled by its package (offline; the text extra)
Your texts: --config.data.format=folder --config.data.train=~/tickets/train
    --config.data.eval=~/tickets/val   (or jsonl / csv with text_key and label_key)
A pretrained backbone: --config.model.backbone=~/presets/bert_tiny (a save_to_preset
    folder) --config.optimizer.learning_rate=5e-5
From your LM (configs/lm.py's sizes): --config.init.checkpoint=runs/lm
"""

import ml_collections

from configs import base


def get_config():
    c = base.get_config()
    c.task.name = "text"
    # backbone: "transformer" (tasks/models/decoder.py's, sized by the fields below; the
    # language model's defaults, so its checkpoints load) or a keras_hub preset folder.
    # pool: first | mean (over the text) | last (a causal backbone's last text token).
    c.model = ml_collections.ConfigDict(dict(
        backbone="transformer", pool="mean", seq_len=128, num_layers=4, d_model=128,
        num_heads=4, mlp_dim=512, dropout=0.1, causal=False, remat=False))
    c.data = ml_collections.ConfigDict(dict(
        format="folder",      # folder | jsonl | csv | tfds
        train="stdlib",       # a folder of class subfolders, a glob of .jsonl/.csv files,
                              # or a TFDS split; stdlib: this Python's definitions by package
        eval="",              # the same for held-out texts; "": eval_fraction of train
        text_key="text", label_key="label",  # jsonl / csv / tfds fields
        eval_fraction=0.1,    # by a hash of each text
        skip_bad=False,       # True: leave out (and count) empty texts
        tfds_name="", tfds_data_dir="",
        global_batch_size=32))
    # The built-in backbone's tokenizer (a preset brings its own; init.checkpoint of a
    # language model, that model's): bytes, or sentencepiece from `model` or trained on
    # train_sample_bytes of the training texts, once per machine (the user cache).
    c.tokenizer = ml_collections.ConfigDict(dict(
        kind="sentencepiece", model="", vocab_size=8000, train_sample_bytes=20_000_000))
    c.optimizer.update(name="adamw", learning_rate=1e-3, schedule="cosine", warmup_steps=100,
                       clip_norm=1.0, weight_decay=0.01)
    c.trainer.update(train_steps=2000, steps_per_loop=50, log_every=100, eval_every=500,
                     checkpoint_every=500, best_metric="eval/macro_f1", best_mode="max")
    # A language model's checkpoint has no classifier head: it starts fresh (and loads
    # from a classifier's checkpoint, to train on after its head).
    c.init.new = (r"classifier/classifier_head/.*",)
    return c
