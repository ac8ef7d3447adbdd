"""CIFAR-10 ResNet on all local GPUs in float16 with dynamic loss scaling."""

from configs import cifar


def get_config():
    c = cifar.get_config()
    c.distribution.strategy = "mirrored"
    c.precision = "mixed_float16"
    c.model.name = "resnet"
    c.data.update(augment=True, normalization="standardize")
    c.optimizer.update(name="sgd", learning_rate=0.1, schedule="cosine", warmup_steps=200)
    c.trainer.update(train_steps=30 * cifar.TRAIN_EXAMPLES // 512, steps_per_loop=100,
                     log_every=100, eval_every=1000, checkpoint_every=1000)
    return c
