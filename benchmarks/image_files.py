"""Labelled images written as a class folder (PNG) or as TFRecord shards of
tf.train.Example: the inputs of benchmarks/input.py and of the file-format tests."""

import os

import tensorflow as tf


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
