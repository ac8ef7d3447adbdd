"""CIFAR-10 with the mixed-precision tutorial's CNN; auto strategy and precision.

python launch.py --config=configs/cifar.py --workdir=runs/cifar

Its data section is the image task's, for every source (configs/images.py reads files).
"""

import ml_collections

from configs import base

TRAIN_EXAMPLES = 50_000


def get_config():
    c = base.get_config()
    c.task.name = "images"
    c.model = ml_collections.ConfigDict(dict(
        name="seed_cnn",           # seed_cnn | resnet (cifar_resnet.py) | vit (vit_cifar.py)
        width=16, blocks_per_stage=3, weight_decay=1e-4))  # resnet only
    c.data = ml_collections.ConfigDict(dict(
        # cifar10: CIFAR-10's arrays. folder: a directory with one subfolder per class
        # (JPEG/PNG/GIF/BMP; labels by sorted class name). tfrecord: a glob of
        # uncompressed TFRecord files of tf.train.Example. tfds: split names of tfds_name,
        # prepared in tfds_data_dir.
        format="cifar10",
        # cifar10: source auto (the real data if found, else a loud synthetic stand-in) |
        # cifar10 | synthetic; data_dir: a folder with cifar-10-batches-py/ or
        # cifar-10-python.tar.gz ("": the Keras cache).
        source="auto", data_dir="", synthetic_train_size=50_000, synthetic_test_size=10_000,
        train="", eval="",         # folder, tfrecord: the train and eval data; tfds: splits
        tfds_name="", tfds_data_dir="",
        # The encoded image and int64 label features ("": image/encoded and
        # image/class/label for tfrecord, image and label for tfds).
        image_key="", label_key="",
        num_classes=0,           # 0: from the data (class folders, TFDS info); tfrecord needs it
        image_size=32,           # files: resized to image_size x image_size, 3 channels
        # A file whose header declares more pixels is bad (an error, or left out with
        # skip_bad), never decoded: 16 decode at once, resized in float32 (Pillow's limit).
        max_image_pixels=89_478_485,
        global_batch_size=512,
        # Pad-4 random crops and flips: right for translation-invariant models (resnet,
        # vit: on in their configs), not for the seed CNN's Flatten-Dense head, which
        # reaches lower accuracy with them in a short run.
        augment=False,
        normalization="unit_range",  # unit_range (pixels / 255) | standardize (mean/std)
        # Files: True decodes every image once at start and trains from memory (about
        # 2 x N * image_size^2 * 3 bytes while it is built).
        cache=False,
        # Files: True finds unreadable image files at start (one decode pass) and leaves
        # them out, the same ones on every launch; False: the first one stops the run.
        skip_bad=False,
        # Files: "": off; "local": a tf.data service inside this process (a dispatcher and
        # service_workers workers; for tests; their gRPC ports listen on every interface,
        # README 'Security'); "grpc://host:port": a running dispatcher
        # (python -m trainer.data.service). Which guarantees change:
        # docs/data.md#the-tfdata-service.
        service="", service_workers=2))
    c.trainer.update(train_steps=10 * TRAIN_EXAMPLES // 512,  # about 10 epochs
                     best_metric="eval/accuracy", best_mode="max")
    return c
