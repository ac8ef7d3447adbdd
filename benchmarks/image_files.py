"""Labelled images written as a class folder (PNG) or as TFRecord shards of
tf.train.Example: the inputs of the benchmarks and of the file-format tests."""

import os

import numpy as np
import tensorflow as tf

from benchmarks.scratch import MARK, fresh_directory


def write_folder(root, images, labels, names=None):
    """root/<class>/<i>.png; classes named by `names` (default: the digit)."""
    for i, (x, y) in enumerate(zip(images, labels)):
        directory = os.path.join(root, names[y] if names else f"digit_{y}")
        os.makedirs(directory, exist_ok=True)
        tf.io.write_file(os.path.join(directory, f"{i:05d}.png"), tf.io.encode_png(x))
    return str(root)


def example(encoded, label, keys=("image/encoded", "image/class/label")):
    return tf.train.Example(features=tf.train.Features(feature={
        keys[0]: tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        keys[1]: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}))


def write_tfrecords(prefix, images, labels, shards=3, keys=("image/encoded",
                                                             "image/class/label")):
    """prefix-0000i-of-0000n shards of tf.train.Example; returns their glob."""
    os.makedirs(os.path.dirname(str(prefix)), exist_ok=True)
    for s in range(shards):
        with tf.io.TFRecordWriter(f"{prefix}-{s:05d}-of-{shards:05d}") as w:
            for x, y in zip(images[s::shards], labels[s::shards]):
                w.write(example(tf.io.encode_png(x).numpy(), y, keys).SerializeToString())
    return f"{prefix}-*"


def make_images(n, seed=0):
    """n distinct 32x32 RGB uint8 images and labels from the digits."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(digits.target), n)
    base = (digits.images[pick] * (255 / 16)).repeat(4, axis=1).repeat(4, axis=2)
    tint = rng.uniform(0.3, 1.0, (n, 1, 1, 3))
    shifted = np.stack([np.roll(b, tuple(rng.integers(-3, 4, 2)), axis=(0, 1)) for b in base])
    images = shifted[..., None] * tint + rng.normal(0, 12, (n, 32, 32, 3))
    return np.clip(images, 0, 255).astype(np.uint8), digits.target[pick].astype(np.int64)


def write_data(root, n):
    """root/{folder/{train,eval}, tfrecord/{train,eval}-*, cifar/cifar-10-batches-py}."""
    from trainer.data.images import cifar10 as cifar10_data
    done = os.path.join(root, f"done_{n}")  # written last: a complete set of n images
    if os.path.exists(done) and os.path.exists(os.path.join(root, MARK)):
        return root
    fresh_directory(root)  # (never a folder the benchmarks did not make)
    images, labels = make_images(n + 2000)
    train, test = slice(0, n), slice(n, None)
    for split, part in (("train", train), ("eval", test)):
        write_folder(os.path.join(root, "folder", split), images[part], labels[part])
        write_tfrecords(os.path.join(root, "tfrecord", split), images[part], labels[part],
                        shards=16 if split == "train" else 2)
    cifar10_data.write_folder(cifar10_data.Cifar10(
        images[train], labels[train].astype(np.int32), images[test],
        labels[test].astype(np.int32), source="benchmark images"),
        os.path.join(root, "cifar", cifar10_data.FOLDER))
    tf.io.write_file(done, "")
    return root
