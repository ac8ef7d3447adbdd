"""Larger byte LM for a TPU: bfloat16, seq_len 512, XLA, 100 steps per host call."""

from configs import lm


def get_config():
    c = lm.get_config()
    c.distribution.strategy = "tpu"
    c.precision = "mixed_bfloat16"
    c.model.update(seq_len=512, num_layers=12, d_model=768, num_heads=12, mlp_dim=3072,
                   dropout=0.1)
    c.data.global_batch_size = 256
    c.optimizer.update(learning_rate=6e-4, warmup_steps=2000)
    c.trainer.update(train_steps=100_000, steps_per_loop=100, eval_every=5000,
                     checkpoint_every=5000, log_every=100, jit_compile="on")
    return c
