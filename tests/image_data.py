"""Tiny real image sets for the file-format tests: scikit-learn's digits (8x8 grayscale,
shipped in its wheel) written as a PNG class folder, as TFRecord shards and as a TFDS
dataset prepared offline."""

import os

import numpy as np
import tensorflow as tf


def digits(n=None):
    """(uint8 images [N, 8, 8, 1], int64 labels [N]) of the digits set, first n."""
    from sklearn.datasets import load_digits
    d = load_digits()
    images = np.round(d.images * (255 / 16)).astype(np.uint8)[..., None]
    return images[:n], d.target[:n].astype(np.int64)


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


def prepare_tfds(data_dir, images, labels, file_format="array_record"):
    """A TFDS dataset `tiny_digits_<file_format>` (train: all but the last 100 examples,
    test: those 100), prepared from the arrays without a download; returns its name."""
    import tensorflow_datasets as tfds
    name = f"tiny_digits_{file_format}"

    class TinyDigits(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(8, 8, 1)),
                "label": tfds.features.ClassLabel(num_classes=10)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(slice(0, -100)),
                    "test": self._generate_examples(slice(-100, None))}

        def _generate_examples(self, part):
            for i, (x, y) in enumerate(zip(images[part], labels[part])):
                yield i, {"image": x, "label": int(y)}

    TinyDigits.name = name
    TinyDigits(data_dir=str(data_dir), file_format=file_format).download_and_prepare(
        download_config=tfds.download.DownloadConfig(verify_ssl=False))
    return name
