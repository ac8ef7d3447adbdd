"""CIFAR-10 ResNet on a TPU in bfloat16, XLA-compiled, 100 steps per host call.

python launch.py --config=configs/cifar_tpu.py --config.distribution.tpu=NAME --workdir=gs://...
"""

from configs import cifar, cifar_resnet


def get_config():
    c = cifar_resnet.get_config()
    c.distribution.strategy = "tpu"
    c.precision = "mixed_bfloat16"
    c.data.global_batch_size = 1024
    c.optimizer.learning_rate = 0.4
    c.trainer.update(train_steps=30 * cifar.TRAIN_EXAMPLES // 1024, eval_every=500,
                     checkpoint_every=500, jit_compile="on")
    return c
