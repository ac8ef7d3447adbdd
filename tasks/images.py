"""Image classification over files: a folder per class, TFRecord shards or a TFDS dataset.

The CIFAR task's models, augmentation and normalization on images of any count of
classes, resized to `data.image_size`. Train batches follow the step-indexed order of
tasks/input_order.py over the examples of tasks/image_sources.py: a resumed run reads
exactly what an uninterrupted one would, each input pipeline reads and decodes only its
own replica batches, and the examples of a global step do not depend on the topology.
"""

import numpy as np
import tensorflow as tf
from absl import logging

from tasks import cifar10, data_service, image_sources, register
from tasks.input_order import step_indexed_indices
from tasks.vit import vit_train_flops
from trainer.runtime.host import available_memory_bytes

AUTOTUNE = tf.data.AUTOTUNE


# The bytes that open and close a whole file of each format: a file that is empty,
# truncated or not an image fails this check and is named, instead of failing in the
# decoder with a message that names no file.
_PNG_HEAD, _PNG_TAIL = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"
_JPEG_HEAD, _JPEG_TAIL = b"\xff\xd8", b"\xff\xd9"
_GIF_HEAD, _GIF_TAIL = b"GIF8", b";"


def looks_whole(encoded):
    """True for bytes that start and end as a whole PNG, JPEG, GIF or BMP file."""
    length = tf.strings.length(encoded)

    def framed(head, tail):
        return (tf.strings.substr(encoded, 0, len(head)) == head) & (
            tf.strings.substr(encoded, tf.maximum(length - len(tail), 0), len(tail)) == tail)

    bmp_size = tf.io.decode_raw(tf.strings.substr(tf.strings.join([encoded, "\0" * 6]), 2, 4),
                                tf.int32, little_endian=True)[0]
    bmp = (tf.strings.substr(encoded, 0, 2) == b"BM") & (length >= 54) & (bmp_size <= length)
    return (framed(_PNG_HEAD, _PNG_TAIL) | framed(_JPEG_HEAD, _JPEG_TAIL)
            | framed(_GIF_HEAD, _GIF_TAIL) | bmp)


def decode(encoded, image_size):
    """(uint8 [image_size, image_size, 3], readable): any size, grayscale, RGB or RGBA,
    resized; zeros where the bytes are not a whole image."""
    readable = looks_whole(encoded)

    def image():
        x = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        x = tf.image.resize(x, [image_size, image_size])
        return tf.cast(tf.clip_by_value(tf.round(x), 0, 255), tf.uint8)

    zeros = lambda: tf.zeros([image_size, image_size, 3], tf.uint8)  # noqa: E731
    return tf.cond(readable, image, zeros), readable


def checked(images, readable, labels, names, num_classes):
    """The batch, after asserting every image was readable and every label in range:
    an error naming the files otherwise."""
    unreadable = tf.debugging.Assert(tf.reduce_all(readable), [
        "Image file(s) that are not whole images (empty, truncated or another format); "
        "remove or fix them, or set --config.data.skip_bad=True to skip them:",
        tf.boolean_mask(names, ~readable)], summarize=20)
    outside = (labels < 0) | (labels >= num_classes)
    out_of_range = tf.debugging.Assert(~tf.reduce_any(outside), [
        f"Labels outside [0, {num_classes}) (data.num_classes) in:",
        tf.boolean_mask(names, outside), "labels:", tf.boolean_mask(labels, outside)],
        summarize=20)
    with tf.control_dependencies([unreadable, out_of_range]):
        return tf.identity(images), tf.identity(labels)


class ImageData:
    """The opened splits: sources, the examples kept (all, or the readable ones with
    data.skip_bad), the class count and, with data.cache, the decoded arrays."""

    def __init__(self, data):
        self.config = data
        self.train = image_sources.open_source(data, "train")
        self.eval = image_sources.open_source(data, "eval", self.train.class_names)
        self.num_classes = self._num_classes()
        self.skipped = {"train": [], "eval": []}  # unreadable files left out (skip_bad)
        self.kept = {split: np.arange(source.size) for split, source in self.splits()}
        self.arrays = {}
        if data.skip_bad or data.cache:
            for split, source in self.splits():
                self._scan(split, source)

    def splits(self):
        return (("train", self.train), ("eval", self.eval))

    def _num_classes(self):
        inferred = len(self.train.class_names)
        wanted = self.config.num_classes
        if inferred and wanted and wanted != inferred:
            raise ValueError(f"data.num_classes={wanted}, but {self.train.description} has "
                             f"{inferred} classes; set 0 to take them from the data.")
        if not (inferred or wanted):
            raise ValueError(f"{self.train.description} does not say how many classes it "
                             "has: set --config.data.num_classes=.")
        return wanted or inferred

    def _scan(self, split, source):
        """Decodes every example once: keeps the readable ones (data.skip_bad; the same
        files each launch, so a resume reads the same stream) and, with data.cache,
        their pixels."""
        image_size = self.config.image_size

        def read(indices):
            encoded, labels, names = source.read(indices)
            return indices, encoded, labels, names

        def load(index, encoded, label, name):
            if source.paths_only:
                encoded = tf.io.read_file(encoded)
            image, readable = decode(encoded, image_size)
            if self.config.skip_bad:  # an unreadable file raises, ignore_errors drops it
                with tf.control_dependencies([tf.debugging.Assert(readable, [name])]):
                    image = tf.identity(image)
            return index, image, readable, label, name

        def check(index, image, readable, label, name):
            image, label = checked(image, readable, label, name, self.num_classes)
            return index, image, label

        ds = tf.data.Dataset.range(source.size).batch(256).map(read, AUTOTUNE).unbatch()
        ds = ds.map(load, AUTOTUNE)
        if self.config.skip_bad:
            ds = ds.ignore_errors()
        indices, images, labels = [], [], []
        for i, x, y in ds.batch(256).map(check).as_numpy_iterator():
            indices.append(i)
            labels.append(y)
            if self.config.cache:
                images.append(x)
        kept = np.concatenate(indices)
        bad = np.setdiff1d(np.arange(source.size), kept)
        if len(bad):
            _, _, names = source.read(tf.constant(bad, tf.int64))
            names = [n.decode() for n in names.numpy()]
            logging.warning("data.skip_bad: skipping %d unreadable %s example(s): %s",
                            len(bad), split, "; ".join(names))
            self.skipped[split] = names
        self.kept[split] = kept
        if self.config.cache:
            self.arrays[split] = (np.concatenate(images), np.concatenate(labels))

    def describe(self):
        skipped = ", ".join(f"{len(names)} unreadable {split} file(s) skipped"
                            for split, names in self.skipped.items() if names)
        skipped = f", {skipped}" if skipped else ""
        cached = ", decoded into memory (data.cache)" if self.config.cache else ""
        return (f"{self.train.description} ({len(self.kept['train'])} train) and "
                f"{self.eval.description} ({len(self.kept['eval'])} eval), "
                f"{self.num_classes} classes at {self.config.image_size}px{skipped}{cached}")


@register("images")
class ImagesTask(cifar10.Cifar10Task):
    """Classifies images read from files; see configs/images.py."""

    @property
    def data(self):
        if self._data is None:
            self._data = ImageData(self.config.data)
            logging.info("Data: %s.", self._data.describe())
        return self._data

    def describe_data(self):
        return self.data.describe()

    def build_model(self):
        return cifar10.MODELS[self.config.model.name](
            self.config.model, self.data.num_classes, self.config.data.image_size)

    def flops_per_example(self):
        if self.config.model.name != "vit":
            return None
        return vit_train_flops(self.config.model, self.data.num_classes,
                               self.config.data.image_size)

    def build_inputs(self, split, input_context, start_step=0):
        c = self.config.data
        batch_size = input_context.get_per_replica_batch_size(c.global_batch_size)
        kept = self.data.kept[split]
        if split == "train" and c.global_batch_size > len(kept):
            raise ValueError(f"data.global_batch_size={c.global_batch_size} is larger than "
                             f"the {len(kept)} training examples; lower it.")
        if split in self.data.arrays:
            images, labels = self.data.arrays[split]
            if split == "train":
                return self._served(cifar10.train_batches(
                    images, labels, batch_size, input_context, start_step, self.config.seed,
                    c.augment, c.normalization)).prefetch(AUTOTUNE)
            ds = tf.data.Dataset.from_tensor_slices((images, labels))
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            return ds.batch(batch_size).map(
                lambda x, y: (cifar10.normalize_fused(x, c.normalization), y),
                AUTOTUNE).prefetch(AUTOTUNE)
        return self._read_and_decode(split, kept, batch_size, input_context, start_step)

    def _read_and_decode(self, split, kept, batch_size, input_context, start_step):
        """Indices -> records (a batch at a time) -> decoded images (one at a time, in
        parallel, in order) -> checked, augmented and normalized batches."""
        c, source = self.config.data, getattr(self.data, split)
        kept_table = tf.constant(kept, tf.int64)
        if split == "train":
            ds = step_indexed_indices(len(kept), batch_size, input_context, start_step,
                                      self.config.seed)
        else:  # one pass, each example once: pipeline p reads examples p, p + P, ...
            ds = tf.data.Dataset.range(len(kept)).shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id)
            ds = ds.batch(batch_size).map(lambda i: (i, tf.constant(0, tf.int64)))

        def read(indices, g):
            encoded, labels, names = source.read(tf.gather(kept_table, indices))
            return encoded, labels, names, tf.fill(tf.shape(indices), g)

        def load(encoded, label, name, g):
            if source.paths_only:
                encoded = tf.io.read_file(encoded)
            image, readable = decode(encoded, c.image_size)
            return image, readable, label, name, g

        def finish(images, readable, labels, names, g):
            images, labels = checked(images, readable, labels, names, self.data.num_classes)
            if split == "train" and c.augment:
                seed = tf.stack([tf.constant(self.config.seed, tf.int64), g[0]])
                return cifar10.augment_and_normalize(images, seed, c.normalization), labels
            return cifar10.normalize_fused(images, c.normalization), labels

        ds = ds.map(read, AUTOTUNE).unbatch().map(load, AUTOTUNE)
        ds = ds.batch(batch_size, drop_remainder=split == "train").map(finish, AUTOTUNE)
        return (self._served(ds) if split == "train" else ds).prefetch(AUTOTUNE)

    def _served(self, train_batches):
        """Through the tf.data service if data.service is set (tasks/data_service.py)."""
        c = self.config.data
        if not c.service:
            return train_batches
        if self.data.train.python_reads and c.service != "local" and not c.cache:
            raise ValueError(
                f"data.service={c.service!r} runs the input pipeline on other machines, "
                f"but {self.data.train.description} is read by Python code, which a "
                "pipeline sent to them cannot hold; use data.format=folder, "
                "data.cache=True, or data.service=local.")
        return data_service.distribute(train_batches, c)

    def input_remedy(self):
        """Decoding is the input work: cache it if it fits, else move it elsewhere."""
        c = self.config.data
        if c.service:
            return ("more tf.data service workers (data.service_workers, or workers on "
                    "other machines for data.service=grpc://...)")
        if c.cache:
            return cifar10.Cifar10Task.input_remedy(self)
        gigabytes = len(self.data.kept["train"]) * c.image_size**2 * 3 / 1e9
        if gigabytes < 0.25 * (available_memory_bytes() or 0) / 1e9:
            return f"data.cache=True decodes every image once into memory ({gigabytes:.2g} GB)"
        return ("data.service=grpc://host:port decodes on other machines (BUILD.md, 'Input "
                f"pipelines'); the decoded images ({gigabytes:.0f} GB) are too many to cache")

    def serving_input(self):
        """uint8 images of any size, resized as in training."""
        c = self.config.data

        def features(images):
            resized = tf.image.resize(images, [c.image_size, c.image_size])
            return cifar10.normalize(tf.clip_by_value(tf.round(resized), 0, 255),
                                     c.normalization)

        return tf.TensorSpec([None, None, None, 3], tf.uint8, name="images"), features
