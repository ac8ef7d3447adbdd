"""Where labelled images live: a folder per class, TFRecord shards, a prepared TFDS dataset.

Each format is opened as a `Source`: N examples addressed by index, read by a graph
function from a batch of int64 indices. That random access is what lets every format
ride the step-indexed order of trainer/data/order.py (exact resume, each input pipeline
reading only its share, the same examples per global step on any topology).
TFRecord files are read at their offsets through an index built at start
(trainer/data/tfrecord_index.py). TFDS datasets are read through `tfds.data_source`
(ArrayRecord) or, for the TFRecord file format, through the same index over the
prepared files.
"""

import collections.abc
import dataclasses
import os

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.data.tfds_prepared import prepared_builder
from trainer.data.tfrecord_index import Index

gfile = tf.io.gfile

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
FORMATS = ("folder", "tfrecord", "tfds")
TFRECORD_KEYS = ("image/encoded", "image/class/label")  # Model Garden's classification keys
TFDS_KEYS = ("image", "label")


@dataclasses.dataclass
class Source:
    """One split. `read(indices)` -> (encoded image bytes or file paths [B] tf.string,
    int64 labels [B], names [B] for messages); `paths_only`: the first are file paths,
    read example by example where they are decoded; `python_reads`: `read` calls
    Python (tf.numpy_function)."""
    size: int
    read: collections.abc.Callable
    description: str
    class_names: tuple = ()
    paths_only: bool = False
    python_reads: bool = False


def open_source(data, split, class_names=()):
    """The Source of `split` ("train" or "eval") per `data` (config.data); for a folder,
    `class_names` (the train folder's) fix the eval labels."""
    if data.format not in FORMATS:
        raise ValueError(f"data.format={data.format!r} is unknown; choose one of {FORMATS}.")
    where = data[split]
    if not where:
        raise ValueError(f"data.{split} is empty: set --config.data.{split}= to "
                         + {"folder": "a directory with one subfolder per class",
                            "tfrecord": "a glob of TFRecord files of tf.train.Example",
                            "tfds": "a split name of data.tfds_name (e.g. train)"}[data.format]
                         + ".")
    if data.format == "folder":
        return folder(os.path.expanduser(where), class_names)
    if data.format == "tfrecord":
        paths = sorted(gfile.glob(os.path.expanduser(where)))
        if not paths:
            raise ValueError(f"data.{split}={where!r} matches no file.")
        keys = (data.image_key or TFRECORD_KEYS[0], data.label_key or TFRECORD_KEYS[1])
        return tfrecords(paths, keys, f"TFRecord {where}")
    return tfds_split(data, where)


def folder(root, class_names=()):
    """The layout `keras.utils.image_dataset_from_directory` reads: root/<class>/...
    (subfolders of a class included), labels by sorted class name. Files that are not
    images and empty class folders are left out with a warning; with `class_names` given
    (eval), a class outside them is an error."""
    if not gfile.isdir(root):
        raise ValueError(f"{root} is not a directory of class folders.")
    classes, paths, labels, ignored, empty = [], [], [], [], []
    for name in sorted(gfile.listdir(root)):
        name = name.rstrip("/")
        directory = os.path.join(root, name)
        if not gfile.isdir(directory):
            ignored.append(name)
            continue
        files = sorted(os.path.join(parent, f) for parent, _, names in gfile.walk(directory)
                       for f in names)
        images = [f for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
        ignored += [os.path.relpath(f, root) for f in files if f not in set(images)]
        if not images:
            empty.append(name)
            continue
        classes.append(name)
        paths += images
        labels += [len(classes) - 1] * len(images)
    if ignored:
        logging.warning("%s: %d file(s) that are not images (%s) are ignored: %s", root,
                        len(ignored), "/".join(IMAGE_EXTENSIONS), ", ".join(ignored[:5])
                        + (" ..." if len(ignored) > 5 else ""))
    if empty:
        logging.warning("%s: class folder(s) without images are ignored: %s", root,
                        ", ".join(empty))
    if not paths:
        raise ValueError(f"{root} holds no class folder with images "
                         f"({'/'.join(IMAGE_EXTENSIONS)}).")
    if class_names:
        unknown = [c for c in classes if c not in class_names]
        if unknown:
            raise ValueError(f"{root} has class folder(s) {unknown} that the train folder "
                             f"lacks (it has {list(class_names)}); remove them or add them "
                             "to the train folder.")
        labels = [class_names.index(classes[i]) for i in labels]
    table_paths = tf.constant(paths)
    table_labels = tf.constant(labels, tf.int64)

    def read(indices):
        names = tf.gather(table_paths, indices)
        return names, tf.gather(table_labels, indices), names

    return Source(len(paths), read, f"folder {root}", tuple(class_names or classes),
                  paths_only=True)


def tfrecords(paths, keys, description, class_names=()):
    """A Source over TFRecord files of tf.train.Example with an encoded image under
    keys[0] and an int64 label under keys[1] (checked in each file's first record)."""
    index = Index(paths)
    logging.info("Indexed %d records in %d TFRecord file(s) (%s).", len(index), len(paths),
                 description)
    for path, record in index.first_records().items():
        features = tf.train.Example.FromString(record).features.feature
        missing = [k for k in keys if k not in features]
        if missing:
            raise ValueError(
                f"{path} has no feature {missing} (its records have {sorted(features)}); "
                "set --config.data.image_key= and --config.data.label_key= to its keys.")
    if not len(index):
        raise ValueError(f"{description} holds no record.")
    spec = {keys[0]: tf.io.FixedLenFeature([], tf.string),
            keys[1]: tf.io.FixedLenFeature([], tf.int64)}

    def read(indices):
        serialized, names = index.read(indices)
        parsed = tf.io.parse_example(serialized, spec)
        return parsed[keys[0]], parsed[keys[1]], names

    return Source(len(index), read, description, class_names, python_reads=True)


def tfds_split(data, split):
    """A split of a prepared TFDS dataset (never downloaded here)."""
    tfds, builder = prepared_builder(data)
    if split not in builder.info.splits:
        raise ValueError(f"{data.tfds_name} has no split {split!r}; it has "
                         f"{sorted(builder.info.splits)}.")
    keys = (data.image_key or TFDS_KEYS[0], data.label_key or TFDS_KEYS[1])
    features = builder.info.features
    missing = [k for k in keys if k not in features]
    if missing:
        raise ValueError(f"{data.tfds_name} has no feature {missing} (it has "
                         f"{sorted(features)}); set data.image_key and data.label_key.")
    label = features[keys[1]]
    class_names = tuple(label.names) if hasattr(label, "names") else ()
    description = f"TFDS {data.tfds_name} {split} ({builder.data_dir})"
    if builder.info.file_format == tfds.core.FileFormat.TFRECORD:
        paths = [str(p) for p in builder.info.splits[split].filepaths]
        return tfrecords(paths, keys, description, class_names)
    return _data_source(tfds, data, split, keys, description, class_names)


def _data_source(tfds, data, split, keys, description, class_names):
    """An ArrayRecord TFDS split through `tfds.data_source` (random access in Python),
    images left encoded so they decode in the graph like the other formats."""
    source = tfds.data_source(data.tfds_name, split=split,
                              data_dir=os.path.expanduser(data.tfds_data_dir) or None,
                              decoders={keys[0]: tfds.decode.SkipDecoding()})
    name = f"{data.tfds_name}[{split}]"

    def fetch(indices):
        records = source.__getitems__([int(i) for i in indices])
        return (np.array([r[keys[0]] for r in records], dtype=object),
                np.array([r[keys[1]] for r in records], dtype=np.int64))

    def read(indices):
        images, labels = tf.numpy_function(fetch, [indices], (tf.string, tf.int64),
                                           stateful=False)
        images.set_shape(indices.shape)
        labels.set_shape(indices.shape)
        names = tf.strings.join([name, " example ", tf.strings.as_string(indices)])
        return images, labels, names

    return Source(len(source), read, description, class_names, python_reads=True)
