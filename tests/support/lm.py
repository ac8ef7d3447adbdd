"""The LM (configs/lm.py) shrunk to seconds: on a corpus written in the test's directory
(tiny_lm), or on a few files of the config's own corpus (tiny_lm_config)."""

import os
import sysconfig

import numpy as np

from configs import lm as lm_config
from support import override

TEXT = b"the quick brown fox jumps over the lazy dog. " * 40


def write_corpus(folder, texts):
    """Each text a file of `folder`; returns a glob of them."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (folder / f"{i:03d}.txt").write_bytes(text)
    return str(folder / "*.txt")


def prose(n_bytes, seed=0):
    """Varied text with rare characters: words of a small vocabulary, some accented, some
    outside any subword vocabulary trained on it."""
    rng = np.random.default_rng(seed)
    words = ["the", "model", "reads", "tokens", "caf\u00e9", "na\u00efve", "data", "of",
             "and", "window", "\u2603", "\U0001f600", "loss", "12", "7"]
    out = []
    while sum(map(len, out)) < n_bytes:
        out.append(" ".join(rng.choice(words, size=12)) + ".\n")
    return "".join(out).encode()


def tiny_lm(tmp_path, text=TEXT, **overrides):
    """A small model on `text` (train) and its last tenth (eval), prepared in tmp_path."""
    c = lm_config.get_config()
    c.precision = "float32"
    c.distribution.strategy = "default"
    c.data.update(train=write_corpus(tmp_path / "corpus", [text]),
                  eval=write_corpus(tmp_path / "held_out", [text[-len(text) // 10:]]),
                  prepared=str(tmp_path / "tokens"), eval_windows=0)
    c.model.update(seq_len=32, num_layers=1, d_model=32, num_heads=2, mlp_dim=64)
    c.optimizer.update(learning_rate=3e-3, warmup_steps=10)
    c.trainer.update(train_steps=150, steps_per_loop=50, log_every=50, eval_every=150,
                     checkpoint_every=150)
    return override(c, **overrides)


def tiny_lm_config(precision, **overrides):
    """A small model on the first 20 KB of the standard library's files, one file of it
    held out (prepared once per test process, in its user cache)."""
    c = lm_config.get_config()
    c.precision = precision
    c.model.update(seq_len=16, num_layers=2, d_model=16, num_heads=2, mlp_dim=32)
    c.data.update(max_bytes=20_000, global_batch_size=8, eval_windows=64,
                  eval=os.path.join(sysconfig.get_paths()["stdlib"], "textwrap.py"))
    c.optimizer.warmup_steps = 1
    c.distribution.strategy = "default"
    c.trainer.update(train_steps=2, steps_per_loop=2, log_every=2, eval_every=2,
                     checkpoint_every=2)
    for key, value in overrides.items():
        section, field = key.split(".")
        c[section][field] = value
    return c
