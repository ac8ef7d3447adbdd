"""Byte-level language model on the Python standard library's source (offline).

python launch.py --config=configs/lm.py --workdir=runs/lm
python launch.py --config=configs/lm.py --workdir=runs/lm --mode=sample --config.sample.prompt='def '
"""

import ml_collections

from configs.cifar import init_config
from trainer.runtime.defaults import WEIGHT_DECAY_EXCLUDE


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.precision = "auto"
    c.precision_overrides = ml_collections.ConfigDict(dict(float32_layers=()))  # see cifar.py
    c.numerics = ml_collections.ConfigDict(dict(every=0, check_steps=20))  # see cifar.py
    c.find_lr = ml_collections.ConfigDict(dict(  # see cifar.py
        min_lr=1e-7, max_lr=10.0, steps=100, diverge=4.0))
    c.find_batch_size = ml_collections.ConfigDict(dict(  # see cifar.py
        start=0, max_trials=12, steps_per_trial=2, multiple_of=8, memory_budget_gb=0.0))
    c.task = ml_collections.ConfigDict(dict(name="lm", module=""))  # module: see cifar.py
    c.model = ml_collections.ConfigDict(dict(
        seq_len=128, num_layers=4, d_model=128, num_heads=4, mlp_dim=512, dropout=0.0,
        tie_embeddings=True, remat=False))
    c.data = ml_collections.ConfigDict(dict(
        files="stdlib",            # a glob of text files; stdlib = this Python's *.py files
        max_bytes=0,               # > 0: read at most this many bytes of the corpus
        validation_fraction=0.01,  # the last 1% of the bytes
        global_batch_size=32))
    c.optimizer = ml_collections.ConfigDict(dict(
        name="adamw", learning_rate=2e-3, schedule="cosine", warmup_steps=200,
        clip_norm=1.0, weight_decay=0.1, momentum=0.9, nesterov=True,
        weight_decay_exclude=WEIGHT_DECAY_EXCLUDE, freeze=(),
        ema_decay=0.0))  # see cifar.py
    c.init = init_config()  # warm start, see configs/cifar.py
    c.loss_scale = ml_collections.ConfigDict(dict(
        dynamic=True, initial_scale=2.0**15, growth_steps=2000))
    c.distribution = ml_collections.ConfigDict(dict(  # see cifar.py
        strategy="auto", tpu="", cluster="tf_config", port_base=8888,
        all_reduce="auto", bytes_per_pack=0, all_reduce_dtype="float32",
        collective_timeout_seconds=600))
    c.trainer = ml_collections.ConfigDict(dict(
        train_steps=3500, steps_per_loop=100, eval_every=500, checkpoint_every=500,
        accumulation_steps=1, per_step_summaries=True,  # see cifar.py
        max_to_keep=3, async_checkpoint="auto", log_every=100, jit_compile="auto", deterministic=False,
        max_nonfinite_steps=0,  # 0: 100 with float16 loss scaling, else 1
        consistency_every=0,  # see cifar.py
        best_metric="eval/loss", best_mode="min", early_stop_patience=0, max_seconds=0.0,
        peak_tflops=0.0,  # see cifar.py
        profile_steps=()))
    c.eval = ml_collections.ConfigDict(dict(timeout_seconds=3600, use_ema=True))  # see cifar.py
    c.actions = ml_collections.ConfigDict()  # see configs/cifar.py
    c.sample = ml_collections.ConfigDict(dict(
        prompt="import ", num_bytes=256, temperature=0.8, top_k=40, seed=0,
        summary_bytes=128))  # a sample of this many bytes in TensorBoard at each eval (0: none)
    c.export = ml_collections.ConfigDict(dict(enabled=False, checkpoint="",
                                              compute_dtype="float32"))  # see cifar.py
    return c
