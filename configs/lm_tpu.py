"""Larger LM for a TPU: SentencePiece tokens prepared once and read from gs://, bfloat16,
seq_len 512, XLA, 100 steps per host call.

First, on a machine with the text (any CPU host):
    python launch.py --config=configs/lm.py --workdir=/tmp/prepare --mode=prepare \
        --config.data.train='~/corpus/**/*.txt' --config.tokenizer.kind=sentencepiece \
        --config.data.prepared=/tmp/tokens
    gsutil -m cp -r /tmp/tokens gs://BUCKET/tokens
then --config.data.prepared=gs://BUCKET/tokens here.
"""

from configs import lm


def get_config():
    c = lm.get_config()
    c.distribution.strategy = "tpu"
    c.precision = "mixed_bfloat16"
    c.data.update(train="", prepared="gs://BUCKET/tokens", document_mask=True,
                  global_batch_size=256)
    c.tokenizer.kind = "sentencepiece"
    c.model.update(seq_len=512, num_layers=12, d_model=768, num_heads=12, mlp_dim=3072,
                   dropout=0.1)
    c.optimizer.update(learning_rate=6e-4, warmup_steps=2000)
    c.trainer.update(train_steps=100_000, steps_per_loop=100, eval_every=5000,
                     checkpoint_every=5000, log_every=100, jit_compile="on")
    return c
