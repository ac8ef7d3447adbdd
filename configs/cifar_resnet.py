"""CIFAR-10 on a ResNet-20 with SGD and a cosine schedule: the recipe the GPU, TPU and
image-file configs share.

python launch.py --config=configs/cifar_resnet.py --workdir=runs/resnet
"""

from configs import cifar


def get_config():
    c = cifar.get_config()
    c.model.name = "resnet"
    c.data.update(augment=True, normalization="standardize")
    c.optimizer.update(name="sgd", learning_rate=0.1, schedule="cosine", warmup_steps=200)
    c.trainer.update(train_steps=30 * cifar.TRAIN_EXAMPLES // 512, steps_per_loop=100,
                     log_every=100, eval_every=1000, checkpoint_every=1000)
    return c
