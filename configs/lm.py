"""Byte-level language model on the Python standard library's source (offline).

python launch.py --config=configs/lm.py --workdir=runs/lm
python launch.py --config=configs/lm.py --workdir=runs/lm --mode=sample --config.sample.prompt='def '
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
        files="stdlib",            # a glob of text files; stdlib = this Python's *.py files
        max_bytes=0,               # > 0: read at most this many bytes of the corpus
        validation_fraction=0.01,  # the last 1% of the bytes
        global_batch_size=32))
    c.optimizer.update(name="adamw", learning_rate=2e-3, schedule="cosine", warmup_steps=200,
                       clip_norm=1.0, weight_decay=0.1)
    c.trainer.update(train_steps=3500, steps_per_loop=100, log_every=100)
    # --mode=sample and TensorBoard's text at each eval: num_tokens (summary_tokens, 0:
    # none) tokens sampled after `prompt`, at `temperature` from the top_k most likely.
    c.sample = ml_collections.ConfigDict(dict(
        prompt="import ", num_tokens=256, temperature=0.8, top_k=40, seed=0,
        summary_tokens=128))
    return c
