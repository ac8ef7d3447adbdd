"""Where labelled images live: a folder per class, TFRecord shards, a prepared TFDS dataset.

Each format is opened as a `Source`: N examples addressed by index, read by a graph
function from a batch of int64 indices. That random access is what lets every format
ride the step-indexed order of tasks/input_order.py (exact resume, each input pipeline
reading only its share, the same examples per global step on any topology).
TFRecord files have no index of their own, so one is built at start from the record
headers (12 bytes per record read, nothing decoded) and records are read at their
offsets. TFDS datasets are read through `tfds.data_source` (ArrayRecord) or, for the
TFRecord file format, through the same record index over the prepared files.
"""

import collections
import dataclasses
import os
import struct
import threading

import numpy as np
import tensorflow as tf
from absl import logging

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
    read: object
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
    """The layout `keras.utils.image_dataset_from_directory` reads: root/<class>/<image>,
    labels by sorted class name. Files that are not images and empty class folders are
    left out with a note; with `class_names` given (eval), a class outside them is an
    error."""
    if not gfile.isdir(root):
        raise ValueError(f"{root} is not a directory of class folders.")
    classes, paths, labels, ignored, empty = [], [], [], [], []
    for name in sorted(gfile.listdir(root)):
        name = name.rstrip("/")
        directory = os.path.join(root, name)
        if not gfile.isdir(directory):
            ignored.append(name)
            continue
        files = sorted(f for f in gfile.listdir(directory) if not gfile.isdir(
            os.path.join(directory, f)))
        images = [f for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
        ignored += [os.path.join(name, f) for f in files if f not in images]
        if not images:
            empty.append(name)
            continue
        classes.append(name)
        paths += [os.path.join(directory, f) for f in images]
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


def index_records(path):
    """(offsets, lengths) of the records of an uncompressed TFRecord file, from their
    headers (8-byte length, 4-byte CRC, data, 4-byte CRC)."""
    size = gfile.stat(path).length
    offsets, lengths = [], []
    with gfile.GFile(path, "rb") as f:
        position = 0
        while position < size:
            f.seek(position)
            header = f.read(12)
            length = struct.unpack("<Q", header[:8])[0] if len(header) == 12 else -1
            if length < 0 or position + 16 + length > size:
                raise ValueError(
                    f"{path} is not an uncompressed TFRecord file (record at byte {position} "
                    "runs past its end): it is truncated or compressed. Random access needs "
                    "uncompressed files; decompress them (or rewrite with "
                    "tf.io.TFRecordWriter and no compression).")
            offsets.append(position + 12)
            lengths.append(length)
            position += 16 + length
    return offsets, lengths


class _RecordReader:
    """Reads records by (file, offset, length) from Python: TensorFlow has no op that
    reads a byte range of a file. Local files by `os.pread` (thread-safe, no seek);
    others (gs://...) by a GFile per thread. Each keeps its `max_open` most recently used
    files open (thousands of shards must not exhaust the process's file handles)."""

    def __init__(self, paths, max_open=64):
        self.paths, self.max_open = paths, max_open
        self.local = threading.local()
        self.lock = threading.Lock()
        self.descriptors = collections.OrderedDict()

    def __call__(self, files, offsets, lengths):
        return np.array([self.read(int(f), int(o), int(n))
                         for f, o, n in zip(files, offsets, lengths)], dtype=object)

    def read(self, f, offset, length):
        path = self.paths[f]
        if "://" not in path:
            with self.lock:  # (no descriptor is closed while it is read)
                fd = self._open(self.descriptors, f, lambda: os.open(path, os.O_RDONLY),
                                os.close)
                return os.pread(fd, length, offset)
        handles = self.local.__dict__.setdefault("handles", collections.OrderedDict())
        handle = self._open(handles, f, lambda: gfile.GFile(path, "rb"), lambda h: h.close())
        handle.seek(offset)
        return handle.read(length)

    def _open(self, table, f, opener, closer):
        if f in table:
            table.move_to_end(f)
        else:
            if len(table) >= self.max_open:
                closer(table.popitem(last=False)[1])
            table[f] = opener()
        return table[f]


def tfrecords(paths, keys, description):
    """A Source over TFRecord files of tf.train.Example with an encoded image under
    keys[0] and an int64 label under keys[1]."""
    check_keys(paths[0], keys)
    files, offsets, lengths, numbers = [], [], [], []
    for i, path in enumerate(paths):
        o, n = index_records(path)
        files += [i] * len(o)
        offsets += o
        lengths += n
        numbers += range(len(o))
    logging.info("Indexed %d records in %d TFRecord file(s) (%s).", len(files), len(paths),
                 description)
    reader = _RecordReader(paths)
    table = [tf.constant(files, tf.int64), tf.constant(offsets, tf.int64),
             tf.constant(lengths, tf.int64)]
    file_names = tf.constant(paths)
    spec = {keys[0]: tf.io.FixedLenFeature([], tf.string),
            keys[1]: tf.io.FixedLenFeature([], tf.int64)}
    record_numbers = tf.constant(numbers, tf.int64)

    def read(indices):
        f, o, n = (tf.gather(t, indices) for t in table)
        serialized = tf.numpy_function(reader, [f, o, n], tf.string, stateful=False)
        serialized.set_shape(indices.shape)
        parsed = tf.io.parse_example(serialized, spec)
        names = tf.strings.join([tf.gather(file_names, f), " record ",
                                 tf.strings.as_string(tf.gather(record_numbers, indices))])
        return parsed[keys[0]], parsed[keys[1]], names

    return Source(len(files), read, description, python_reads=True)


def check_keys(path, keys):
    """The first record of `path` holds both keys, else an error naming the keys it has."""
    for record in tf.data.TFRecordDataset(path).take(1):
        features = tf.train.Example.FromString(record.numpy()).features.feature
        missing = [k for k in keys if k not in features]
        if missing:
            raise ValueError(
                f"{path} has no feature {missing} (its records have {sorted(features)}); "
                "set --config.data.image_key= and --config.data.label_key= to its keys.")
        return
    raise ValueError(f"{path} holds no record.")


def tfds_split(data, split):
    """A split of a prepared TFDS dataset (never downloaded here)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError("data.format=tfds needs tensorflow-datasets: pip install "
                          "'tftrainer[data]'.") from e
    if not data.tfds_name:
        raise ValueError("data.format=tfds needs --config.data.tfds_name=.")
    data_dir = os.path.expanduser(data.tfds_data_dir) or None
    builder = tfds.builder(data.tfds_name, data_dir=data_dir)
    if not builder.is_prepared():
        raise ValueError(f"TFDS dataset {data.tfds_name} is not prepared in "
                         f"{builder.data_dir}: prepare it first (tfds build, or "
                         "builder.download_and_prepare()) and set data.tfds_data_dir.")
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
        source = tfrecords(paths, keys, description)
        source.class_names = class_names
        return source
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
