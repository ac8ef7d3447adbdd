"""The byte LM (configs/lm.py) shrunk to seconds: on a corpus written in the test's
directory (tiny_lm), or on the config's own corpus (tiny_lm_config)."""

from configs import lm as lm_config
from support import override

TEXT = b"the quick brown fox jumps over the lazy dog. " * 40


def tiny_lm(tmp_path, text=TEXT, **overrides):
    (tmp_path / "corpus").mkdir(exist_ok=True)
    (tmp_path / "corpus" / "a.txt").write_bytes(text)
    c = lm_config.get_config()
    c.precision = "float32"
    c.distribution.strategy = "default"
    c.data.files = str(tmp_path / "corpus" / "*.txt")
    c.data.validation_fraction = 0.1
    c.model.update(seq_len=32, num_layers=1, d_model=32, num_heads=2, mlp_dim=64)
    c.optimizer.update(learning_rate=3e-3, warmup_steps=10)
    c.trainer.update(train_steps=150, steps_per_loop=50, log_every=50, eval_every=150,
                     checkpoint_every=150)
    return override(c, **overrides)


def tiny_lm_config(precision, **overrides):
    c = lm_config.get_config()
    c.precision = precision
    c.model.update(seq_len=16, num_layers=2, d_model=16, num_heads=2, mlp_dim=32)
    c.data.update(max_bytes=20_000, global_batch_size=8)
    c.optimizer.warmup_steps = 1
    c.distribution.strategy = "default"
    c.trainer.update(train_steps=2, steps_per_loop=2, log_every=2, eval_every=2,
                     checkpoint_every=2)
    for key, value in overrides.items():
        section, field = key.split(".")
        c[section][field] = value
    return c
