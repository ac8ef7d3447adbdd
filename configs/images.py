"""Image classification over your own files: a folder per class, TFRecord shards or TFDS.

python launch.py --config=configs/images.py --workdir=runs/pets \
    --config.data.format=folder --config.data.train=~/pets/train --config.data.eval=~/pets/val

Every field of configs/cifar.py applies; the data fields differ (BUILD.md, "Input
pipelines").
"""

import ml_collections

from configs import cifar


def get_config():
    c = cifar.get_config()
    c.task.name = "images"
    c.model.name = "resnet"  # seed_cnn | resnet | vit (with the vit fields of vit_cifar.py)
    c.data = ml_collections.ConfigDict(dict(
        format="folder",  # folder | tfrecord | tfds
        # folder: a directory with one subfolder per class (JPEG/PNG/GIF/BMP; labels by
        # sorted class name). tfrecord: a glob of uncompressed TFRecord files of
        # tf.train.Example. tfds: split names of tfds_name, prepared in tfds_data_dir.
        train="", eval="",
        tfds_name="", tfds_data_dir="",
        # The encoded image and int64 label features ("": image/encoded and
        # image/class/label for tfrecord, image and label for tfds).
        image_key="", label_key="",
        num_classes=0,           # 0: from the data (class folders, TFDS info); tfrecord needs it
        image_size=64,           # every image is resized to image_size x image_size, 3 channels
        # A file whose header declares more pixels is bad (an error, or left out with
        # skip_bad), never decoded: 16 decode at once, resized in float32 (Pillow's limit).
        max_image_pixels=89_478_485,
        global_batch_size=128,
        augment=True,            # pad-4 random crops and flips, as the CIFAR task's
        normalization="standardize",  # unit_range | standardize
        # True: decode every image once at start and train from memory (as fast as the
        # in-memory tasks; about 2 x N * image_size^2 * 3 bytes while it is built).
        cache=False,
        # True: unreadable image files are found at start (one decode pass) and left out,
        # the same ones on every launch; False: the first one stops the run, named.
        skip_bad=False,
        # "": off; "local": a tf.data service inside this process (a dispatcher and
        # service_workers workers; for tests; their gRPC ports listen on every interface,
        # README 'Security'); "grpc://host:port": a running dispatcher
        # (python -m tasks.data_service). BUILD.md says which guarantees change.
        service="", service_workers=2))
    c.optimizer.update(name="sgd", learning_rate=0.1, schedule="cosine", warmup_steps=200)
    c.trainer.update(train_steps=5000, steps_per_loop=100, log_every=100, eval_every=1000,
                     checkpoint_every=1000)
    return c
