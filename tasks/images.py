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

from tasks import cifar10, data_service, image_decode, image_sources, register
from tasks.input_order import step_indexed_indices
from tasks.vit import vit_train_flops
from trainer.runtime.host import available_memory_bytes

AUTOTUNE = tf.data.AUTOTUNE


def read_batch(source, examples, image_size, num_classes):
    """Checked uint8 images [B, s, s, 3] and labels [B] of `source`'s examples [B]."""
    encoded, labels, names = source.read(examples)
    if source.paths_only:
        encoded = image_decode.read_files(encoded)
    images, readable = image_decode.decode_batch(encoded, image_size)
    return image_decode.checked(images, readable, labels, names, num_classes)


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
        c = self.config
        ds = tf.data.Dataset.range(source.size).batch(256)
        if c.skip_bad:  # one file at a time: ignore_errors drops those that fail
            ds = ds.map(lambda i: (i, *source.read(i)), AUTOTUNE).unbatch().map(
                lambda i, encoded, label, name: self._readable_or_error(
                    source, i, encoded, label, name), AUTOTUNE).ignore_errors().batch(256)
        else:
            ds = ds.map(lambda i: (i, *read_batch(source, i, c.image_size, self.num_classes)),
                        AUTOTUNE)
        indices, images, labels = [], [], []
        for i, x, y in ds.as_numpy_iterator():
            indices.append(i)
            labels.append(y)
            if c.cache:
                images.append(x)
        kept = np.concatenate(indices)
        outside = kept[(np.concatenate(labels) < 0) | (np.concatenate(labels) >= self.num_classes)]
        if len(outside):  # (checked in the graph without skip_bad)
            _, found, names = source.read(tf.constant(outside[:20], tf.int64))
            raise ValueError(f"Labels outside [0, {self.num_classes}) (data.num_classes): "
                             + ", ".join(f"{n.decode()}: {y}" for n, y in zip(
                                 names.numpy(), found.numpy())))
        bad = np.setdiff1d(np.arange(source.size), kept)
        if len(bad):
            _, _, names = source.read(tf.constant(bad, tf.int64))
            names = [n.decode() for n in names.numpy()]
            logging.warning("data.skip_bad: skipping %d unreadable %s example(s): %s",
                            len(bad), split, "; ".join(names))
            self.skipped[split] = names
        self.kept[split] = kept
        if c.cache:
            self.arrays[split] = (np.concatenate(images), np.concatenate(labels))

    def _readable_or_error(self, source, index, encoded, label, name):
        """(index, image, label) of one example; an error where it is unreadable."""
        if source.paths_only:
            encoded = tf.io.read_file(encoded)
        readable = image_decode.looks_whole(encoded)
        with tf.control_dependencies([tf.debugging.Assert(readable, [name])]):
            return index, image_decode.decode(encoded, self.config.image_size), label

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
        """Replica batches of indices -> records -> checked, decoded, augmented and
        normalized images, one map call per batch."""
        c, source = self.config.data, getattr(self.data, split)
        kept_table = tf.constant(kept, tf.int64)
        if split == "train":
            ds = step_indexed_indices(len(kept), batch_size, input_context, start_step,
                                      self.config.seed)
        else:  # one pass, each example once: pipeline p reads examples p, p + P, ...
            ds = tf.data.Dataset.range(len(kept)).shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id)
            ds = ds.batch(batch_size).map(lambda i: (i, tf.constant(0, tf.int64)))

        def batch(indices, g):
            images, labels = read_batch(source, tf.gather(kept_table, indices),
                                        c.image_size, self.data.num_classes)
            if split == "train" and c.augment:
                seed = tf.stack([tf.constant(self.config.seed, tf.int64), g])
                return cifar10.augment_and_normalize(images, seed, c.normalization), labels
            return cifar10.normalize_fused(images, c.normalization), labels

        ds = ds.map(batch, AUTOTUNE)
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
