"""Language model on the Python standard library's source (offline), bytes as tokens.

python launch.py --config=configs/lm.py --workdir=runs/lm
python launch.py --config=configs/lm.py --workdir=runs/lm --mode=sample --config.sample.prompt='def '

Your text: --config.data.train='~/corpus/**/*.txt' (or a JSONL glob with
--config.data.format=jsonl), and subword tokens: --config.tokenizer.kind=sentencepiece.
The first run prepares token shards (docs/data.md#token-shards); --mode=prepare does it
alone.
"""

import ml_collections

from configs import base


def get_config():
    c = base.get_config()
    c.task.name = "lm"
    c.model = ml_collections.ConfigDict(dict(
        seq_len=128, num_layers=4, d_model=128, num_heads=4, mlp_dim=512, dropout=0.0,
        tie_embeddings=True, remat=False))
    c.data = ml_collections.ConfigDict(dict(
        train="stdlib",       # a glob of text files (** and gs:// too); stdlib = this
                              # Python's *.py files
        eval="",              # a glob of held-out files; "": eval_fraction of the training
                              # documents, chosen by a hash of each one's text
        format="text",        # text: a file is a document | jsonl: a record's text_key field is
        text_key="text",
        eval_fraction=0.01,
        skip_bad=False,       # True: leave out (and count) documents that cannot be read
        max_bytes=0,          # > 0: only the first training files (path order) reaching this size
        # The token shards; "": in the user cache, named by the fields above and the
        # tokenizer's, so runs of one corpus share them. A gs:// directory is read as is.
        prepared="",
        document_mask=False,  # True: attention stays inside each packed document
        eval_windows=512,     # held-out windows of seq_len scored at each eval (0: all)
        global_batch_size=32))
    # bytes (256 ids and a separator) or sentencepiece: `model`, a .model file, or ""
    # for one of vocab_size pieces trained when preparing, on train_sample_bytes of the
    # training documents, and kept with the shards.
    c.tokenizer = ml_collections.ConfigDict(dict(
        kind="bytes", model="", vocab_size=8000, train_sample_bytes=20_000_000))
    c.optimizer.update(name="adamw", learning_rate=2e-3, schedule="cosine", warmup_steps=200,
                       clip_norm=1.0, weight_decay=0.1)
    c.trainer.update(train_steps=3500, steps_per_loop=100, log_every=100)
    # --mode=sample, the exported `generate` and TensorBoard's text at each eval:
    # num_tokens (summary_tokens, 0: none) tokens sampled after `prompt`, at
    # `temperature` from the top_k most likely, fewer if the document ends.
    c.sample = ml_collections.ConfigDict(dict(
        prompt="import ", num_tokens=256, temperature=0.8, top_k=40, seed=0,
        summary_tokens=128))
    return c
