"""CIFAR-10 ResNet on all local GPUs in float16 with dynamic loss scaling."""

from configs import cifar_resnet


def get_config():
    c = cifar_resnet.get_config()
    c.distribution.strategy = "mirrored"
    c.precision = "mixed_float16"
    return c
