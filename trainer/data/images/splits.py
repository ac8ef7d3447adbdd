"""The train and eval splits of an image task, opened only when needed (a model or an
export needs the class count alone, an eval only its split); files once per process."""

import json

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.data.images import cifar10, decode as image_decode, sources as image_sources

AUTOTUNE = tf.data.AUTOTUNE
_OPENED = {}  # data config (JSON) -> ImageSplits: the finders build many tasks of one run


def image_splits(data):
    """The splits of `data` (config.data): CIFAR-10's arrays (data.format=cifar10, loaded
    by each task that reads them), or the ImageSplits of files, shared by the tasks of
    this process."""
    if data.format == "cifar10":
        return Cifar10Splits(data)
    key = json.dumps(data.to_dict(), sort_keys=True, default=str)
    if key not in _OPENED:
        _OPENED[key] = ImageSplits(data)
    return _OPENED[key]


def read_batch(source, examples, data, num_classes):
    """Checked uint8 images [B, s, s, 3] and labels [B] of `source`'s examples [B]
    (`data`: config.data)."""
    encoded, labels, names = source.read(examples)
    if source.paths_only:
        encoded = image_decode.read_files(encoded)
    images, readable, pixels = image_decode.decode_batch(encoded, data.image_size,
                                                         data.max_image_pixels)
    return image_decode.checked(images, readable, pixels, data.max_image_pixels, labels,
                                names, num_classes)


class Cifar10Splits:
    """CIFAR-10's splits, decoded in memory when first read (a model or an export needs
    only the class count and the image size, which are fixed): nothing to scan."""

    num_classes, image_size = 10, 32

    def __init__(self, data):
        for field, value, fits in (("image_size", data.image_size, (self.image_size,)),
                                   ("num_classes", data.num_classes, (0, self.num_classes))):
            if value not in fits:
                raise ValueError(f"data.{field}={value}, but CIFAR-10 has {self.num_classes} "
                                 f"classes of {self.image_size}x{self.image_size} images: set "
                                 f"--config.data.{field}={fits[-1]}.")
        self.config, self._loaded = data, None

    @property
    def arrays(self):
        """{split: (uint8 images, int32 labels)}."""
        return self._load()[0]

    def kept(self, split):
        return np.arange(len(self.arrays[split][1]))

    def opened(self):
        return []

    def describe(self):
        """Where the arrays came from (the real data, or the synthetic stand-in)."""
        return self._load()[1]

    def _load(self):
        if self._loaded is None:
            loaded = cifar10.load(self.config)
            logging.info("Data: %s (%d train, %d test images).", loaded.source,
                         len(loaded.train_labels), len(loaded.test_labels))
            self._loaded = ({"train": (loaded.train_images, loaded.train_labels),
                             "eval": (loaded.test_images, loaded.test_labels)}, loaded.source)
        return self._loaded


class ImageSplits:
    """Sources, the examples kept (all, or the readable ones with data.skip_bad), the
    class count and, with data.cache, the decoded arrays."""

    def __init__(self, data):
        self.config, self.image_size = data, data.image_size
        self._sources, self._kept, self.arrays = {}, {}, {}
        self.skipped = {}  # split -> unreadable files left out (data.skip_bad)

    def source(self, split):
        if split not in self._sources:
            class_names = self.source("train").class_names if split == "eval" else ()
            self._sources[split] = image_sources.open_source(self.config, split, class_names)
            if split == "train":
                self._check_num_classes()
        return self._sources[split]

    @property
    def num_classes(self):
        """data.num_classes if set (no data opened), else what the train split says."""
        if self.config.num_classes:
            return self.config.num_classes
        return self._check_num_classes()

    def _check_num_classes(self):
        source, wanted = self.source("train"), self.config.num_classes
        inferred = len(source.class_names)
        if inferred and wanted and wanted != inferred:
            raise ValueError(f"data.num_classes={wanted}, but {source.description} has "
                             f"{inferred} classes; set 0 to take them from the data.")
        if not (inferred or wanted):
            raise ValueError(f"{source.description} does not say how many classes it has: "
                             "set --config.data.num_classes=.")
        return wanted or inferred

    def kept(self, split):
        """The example indices a split reads, after the start-up pass if one is asked."""
        if split not in self._kept:
            source = self.source(split)
            if self.config.skip_bad or self.config.cache:
                self._scan(split, source)
            else:
                self._kept[split] = np.arange(source.size)
            logging.info("Data: %s", self.describe(split))
        return self._kept[split]

    def _scan(self, split, source):
        """Decodes every example once: keeps the readable ones (data.skip_bad; the same
        files each launch, so a resume reads the same stream) and, with data.cache,
        their pixels."""
        c = self.config
        if c.skip_bad:
            ds = self._readable_examples(source)
        else:
            ds = tf.data.Dataset.range(source.size).batch(256).map(
                lambda i: (i, *read_batch(source, i, c, self.num_classes)),
                AUTOTUNE)
        indices, images, labels = [], [], []
        for i, x, y in ds.as_numpy_iterator():
            indices.append(i)
            labels.append(y)
            if c.cache:
                images.append(x)
        if not indices:
            raise ValueError(f"{source.description}: no image could be decoded.")
        kept, labels = np.concatenate(indices), np.concatenate(labels)
        self._check_labels(source, kept[(labels < 0) | (labels >= self.num_classes)])
        self.skipped[split] = self._names(source, np.setdiff1d(np.arange(source.size), kept))
        if self.skipped[split]:
            logging.warning("data.skip_bad: leaving out %d unreadable %s file(s) (not an "
                            "image, damaged, or over data.max_image_pixels): %s%s",
                            len(self.skipped[split]), split, "; ".join(self.skipped[split][:20]),
                            " ..." if len(self.skipped[split]) > 20 else "")
        self._kept[split] = kept
        if c.cache:
            self.arrays[split] = (np.concatenate(images), labels)

    def _readable_examples(self, source):
        """(indices, images, labels) batches of the examples that decode (and declare at
        most data.max_image_pixels, so that a decode never exhausts memory). Each decode is
        a dataset of its own whose errors are dropped, so one bad file costs only itself,
        and a failed read (not a decode) still stops the scan."""
        size = self.config.image_size

        def decoded(index, encoded, label, name):
            def decode(encoded):
                readable = image_decode.looks_like_image(encoded) & (
                    image_decode.declared_pixels(encoded[None])[0]
                    <= self.config.max_image_pixels)
                with tf.control_dependencies([tf.debugging.Assert(readable, [name])]):
                    return index, image_decode.decode(encoded, size), label

            return tf.data.Dataset.from_tensors(encoded).map(decode).ignore_errors()

        def read(indices):
            encoded, labels, names = source.read(indices)
            if source.paths_only:
                encoded = image_decode.read_files(encoded)
            return indices, encoded, labels, names

        ds = tf.data.Dataset.range(source.size).batch(256).map(read, AUTOTUNE).unbatch()
        return ds.interleave(decoded, cycle_length=16, num_parallel_calls=AUTOTUNE,
                             deterministic=True).batch(256)

    def unreadable(self, split):
        """The files of an opened split that do not decode (one pass over it)."""
        source = self._sources[split]
        kept = np.concatenate([i for i, _, _ in self._readable_examples(
            source).as_numpy_iterator()] or [np.zeros([0], np.int64)])
        return self._names(source, np.setdiff1d(np.arange(source.size), kept))

    def opened(self):
        return list(self._sources)

    def _check_labels(self, source, outside):
        """Labels out of range, named (the pipelines check them in the graph)."""
        if len(outside):
            _, labels, names = source.read(tf.constant(outside[:20], tf.int64))
            raise ValueError(f"Labels outside [0, {self.num_classes}) (data.num_classes): "
                             + ", ".join(f"{n.decode()}: {y}" for n, y in zip(
                                 names.numpy(), labels.numpy())))

    @staticmethod
    def _names(source, indices):
        if not len(indices):
            return []
        return [n.decode() for n in source.read(tf.constant(indices, tf.int64))[2].numpy()]

    def describe(self, split=None):
        """One line per opened split (or `split`): where, how many, what was left out."""
        lines = []
        for s in [split] if split else self.opened():
            kept = self._kept.get(s)
            count = f"{len(kept)} {s} examples" if kept is not None else s
            skipped = (f", {len(self.skipped[s])} unreadable file(s) skipped"
                       if self.skipped.get(s) else "")
            cached = ", decoded into memory (data.cache)" if s in self.arrays else ""
            lines.append(f"{self._sources[s].description} ({count}{skipped}{cached})")
        return "; ".join(lines) + f"; {self.num_classes} classes at {self.config.image_size}px"
