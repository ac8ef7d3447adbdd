"""Image classification over your own files: a folder per class, TFRecord shards or TFDS.

python launch.py --config=configs/images.py --workdir=runs/pets \
    --config.data.format=folder --config.data.train=~/pets/train --config.data.eval=~/pets/val

The data fields are configs/cifar.py's; the model and optimizer, cifar_resnet.py's.
"""

from configs import cifar_resnet


def get_config():
    c = cifar_resnet.get_config()
    c.data.update(format="folder", image_size=64, global_batch_size=128)
    c.trainer.update(train_steps=5000)
    return c
