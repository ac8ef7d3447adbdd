"""CIFAR-10 ResNet on a TPU in bfloat16, XLA-compiled, 100 steps per host call.

python launch.py --config=configs/cifar_tpu.py --config.distribution.tpu=NAME --workdir=gs://...
"""

from configs import cifar


def get_config():
    c = cifar.get_config()
    c.distribution.strategy = "tpu"
    c.precision = "mixed_bfloat16"
    c.model.name = "resnet"
    c.data.update(augment=True, normalization="standardize")
    c.data.global_batch_size = 1024
    c.optimizer.update(name="sgd", learning_rate=0.4, schedule="cosine", warmup_steps=200)
    c.trainer.update(train_steps=30 * cifar.TRAIN_EXAMPLES // 1024, steps_per_loop=100,
                     log_every=100, eval_every=500, checkpoint_every=500, jit_compile="on")
    return c
