"""Random access to the records of TFRecord files: an index of their offsets, and a
reader of byte ranges.

A TFRecord file is a sequence of (8-byte length, 4-byte CRC, data, 4-byte CRC) with no
index of its own, and TensorFlow has no op that reads a byte range of a file; both are
here so that TFRecords ride the step-indexed order (trainer/data/order.py) as files in
a folder do.
"""

import collections
import os
import struct
import threading

import numpy as np
import tensorflow as tf

gfile = tf.io.gfile


def _is_local(path):
    return "://" not in path


def index_records(path):
    """(offsets, lengths) of the records of an uncompressed TFRecord file, read from
    their length headers (12 bytes per record; the data is skipped)."""
    size = gfile.stat(path).length
    offsets, lengths = [], []
    with (open(path, "rb", buffering=0) if _is_local(path) else gfile.GFile(path, "rb")) as f:
        position = 0
        while position < size:
            f.seek(position)
            header = f.read(12)
            length = struct.unpack("<Q", header[:8])[0] if len(header) == 12 else -1
            if length < 0 or position + 16 + length > size:
                raise ValueError(
                    f"{path} is not an uncompressed TFRecord file (the record at byte "
                    f"{position} runs past its end): it is truncated or compressed. Random "
                    "access needs uncompressed files: decompress them, or rewrite them with "
                    "tf.io.TFRecordWriter without compression.")
            offsets.append(position + 12)
            lengths.append(length)
            position += 16 + length
    return offsets, lengths


class RecordReader:
    """Reads records by (file, offset, length), from Python (`tf.numpy_function`).

    Each thread keeps its own `max_open` most recently used files open (thousands of
    shards must not exhaust the process's file handles, and no thread closes a file
    another is reading); local files are read with `os.pread`, others (gs://...)
    through a GFile.
    """

    def __init__(self, paths, max_open=64):
        self.paths, self.max_open = paths, max_open
        self.local = threading.local()

    def __call__(self, files, offsets, lengths):
        return np.array([self.read(int(f), int(o), int(n))
                         for f, o, n in zip(files, offsets, lengths)], dtype=object)

    def read(self, f, offset, length):
        handle = self._handle(f)
        if _is_local(self.paths[f]):
            return os.pread(handle.fileno(), length, offset)
        handle.seek(offset)
        return handle.read(length)

    def _handle(self, f):
        handles = self.local.__dict__.setdefault("handles", collections.OrderedDict())
        if f in handles:
            handles.move_to_end(f)
        else:
            if len(handles) >= self.max_open:
                handles.popitem(last=False)[1].close()
            path = self.paths[f]
            handles[f] = (open(path, "rb", buffering=0) if _is_local(path)
                          else gfile.GFile(path, "rb"))
        return handles[f]


class Index:
    """Every record of `paths`, in file order: record i is at (file, offset, length)."""

    def __init__(self, paths):
        self.paths = paths
        files, offsets, lengths, numbers = [], [], [], []
        for i, path in enumerate(paths):
            o, n = index_records(path)
            files += [i] * len(o)
            offsets += o
            lengths += n
            numbers += range(len(o))
        self.files, self.offsets, self.lengths = (np.array(files, np.int64), np.array(
            offsets, np.int64), np.array(lengths, np.int64))
        self.numbers = np.array(numbers, np.int64)  # the record's place in its file
        self.reader = RecordReader(paths)

    def __len__(self):
        return len(self.files)

    def first_records(self):
        """{path: the serialized first record} of each non-empty file."""
        first = np.flatnonzero(self.numbers == 0)
        return {self.paths[self.files[i]]: self.reader.read(
            self.files[i], self.offsets[i], self.lengths[i]) for i in first}

    def read(self, indices):
        """(serialized records [B], names [B] "file record n") of record indices [B]."""
        f, o, n = (tf.gather(t, indices) for t in (self.files, self.offsets, self.lengths))
        serialized = tf.numpy_function(self.reader, [f, o, n], tf.string, stateful=False)
        serialized.set_shape(indices.shape)
        names = tf.strings.join([tf.gather(tf.constant(self.paths), f), " record ",
                                 tf.strings.as_string(tf.gather(self.numbers, indices))])
        return serialized, names
