"""Image classification over every image source: CIFAR-10's arrays, a folder per class,
TFRecord shards or a TFDS dataset (`data.format`).

Train batches follow the step-indexed order of trainer/data/order.py: a resumed run reads
exactly what an uninterrupted one would, each input pipeline reads and decodes only its
own replica batches (the start-up pass of data.cache or data.skip_bad reads them all),
and the examples of a global step do not depend on the topology. Images held in memory
(CIFAR-10, data.cache) are gathered; files are read, checked and decoded per batch.
"""

import keras
import tensorflow as tf

from tasks.models.cnn import resnet, seed_cnn
from tasks.models.vit import vit, vit_train_flops
from trainer.data import service as data_service
from trainer.data.images.preprocess import (NORMALIZATIONS, augment_and_normalize, normalize,
                                            normalize_fused, train_batches)
from trainer.data.images.splits import image_splits, read_batch
from trainer.data.order import step_indexed_indices
from trainer.runtime.host import available_memory_bytes
from trainer.task import Task, register

AUTOTUNE = tf.data.AUTOTUNE
MODELS = {"seed_cnn": seed_cnn, "resnet": resnet, "vit": vit}
FORMATS = ("cifar10", "folder", "tfrecord", "tfds")


@register("images")
class ImageClassificationTask(Task):
    """Classifies images into data.num_classes classes; see configs/cifar.py and
    configs/images.py."""

    def __init__(self, config):
        super().__init__(config)
        for field, value, known in (("model.name", config.model.name, MODELS),
                                    ("data.format", config.data.format, FORMATS),
                                    ("data.normalization", config.data.normalization,
                                     NORMALIZATIONS)):
            if value not in known:
                raise ValueError(f"config.{field}={value!r} is unknown for task images; "
                                 f"choose one of {sorted(known)}.")
        self._data = None

    @property
    def data(self):
        """The splits, opened once per task (files: once per process)."""
        if self._data is None:
            self._data = image_splits(self.config.data)
        return self._data

    def data_paths(self):
        c = self.config.data
        return tuple(p for p in (c.train, c.eval) if p) if c.format in ("folder",
                                                                        "tfrecord") else ()

    def describe_data(self):
        return self.data.describe()

    def build_model(self):
        return MODELS[self.config.model.name](self.config.model, self.data.num_classes,
                                              self.data.image_size)

    def flops_per_example(self):
        """The ViT's by its formula; the CNNs' are counted on their graph."""
        if self.config.model.name != "vit":
            return None
        return vit_train_flops(self.config.model, self.data.num_classes, self.data.image_size)

    def build_inputs(self, split, input_context, start_step=0):
        c = self.config.data
        batch_size = input_context.get_per_replica_batch_size(c.global_batch_size)
        kept = self.data.kept(split)
        if split == "train" and c.global_batch_size > len(kept):
            raise ValueError(f"data.global_batch_size={c.global_batch_size} is larger than "
                             f"the {len(kept)} training examples; lower "
                             "--config.data.global_batch_size.")
        if split in self.data.arrays:
            images, labels = self.data.arrays[split]
            if split == "train":
                return self._served(train_batches(
                    images, labels, batch_size, input_context, start_step, self.config.seed,
                    c.augment, c.normalization)).prefetch(AUTOTUNE)
            ds = tf.data.Dataset.from_tensor_slices((images, labels))
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            return ds.batch(batch_size).map(
                lambda x, y: (normalize_fused(x, c.normalization), y),
                AUTOTUNE).prefetch(AUTOTUNE)
        return self._read_and_decode(split, kept, batch_size, input_context, start_step)

    def _read_and_decode(self, split, kept, batch_size, input_context, start_step):
        """Replica batches of indices -> records -> checked, decoded, augmented and
        normalized images, one map call per batch."""
        c, source = self.config.data, self.data.source(split)
        kept_table = tf.constant(kept, tf.int64)
        if split == "train":
            ds = step_indexed_indices(len(kept), batch_size, input_context, start_step,
                                      self.config.seed)
        else:  # one pass, each example once: pipeline p reads examples p, p + P, ...
            ds = tf.data.Dataset.range(len(kept)).shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id)
            ds = ds.batch(batch_size).map(lambda i: (i, tf.constant(0, tf.int64)))

        def batch(indices, g):
            images, labels = read_batch(source, tf.gather(kept_table, indices), c,
                                        self.data.num_classes)
            if split == "train" and c.augment:
                seed = tf.stack([tf.constant(self.config.seed, tf.int64), g])
                return augment_and_normalize(images, seed, c.normalization), labels
            return normalize_fused(images, c.normalization), labels

        ds = ds.map(batch, AUTOTUNE)
        return (self._served(ds) if split == "train" else ds).prefetch(AUTOTUNE)

    def _served(self, batches):
        """Through the tf.data service if data.service is set (trainer/data/service.py)."""
        c = self.config.data
        if not c.service:
            return batches
        if c.format == "cifar10" or c.cache:
            raise ValueError(f"data.format={c.format}" + (" with data.cache=True" if c.cache
                             else "") + " leaves no decoding for data.service to take over "
                             "(and would send the decoded images to every service worker): "
                             "unset one of them.")
        if self.data.source("train").python_reads and c.service != "local":
            raise ValueError(
                f"data.service={c.service!r} runs the input pipeline on other machines, "
                f"but {self.data.source('train').description} is read by Python code, "
                "which a pipeline sent to them cannot hold: use data.format=folder, or "
                "data.cache=True without the service.")
        return data_service.distribute(batches, c)

    def explain_input_error(self, error):
        """A decoder's error names no file: find the files that do not decode and name
        them (one decode pass over the opened splits, on failure only)."""
        if not (isinstance(error, tf.errors.InvalidArgumentError) and any(
                op in str(error) for op in ("DecodeImage", "ExtractJpegShape"))):
            return None  # another error: the run says it as is
        bad = [name for split in self.data.opened() for name in self.data.unreadable(split)]
        if not bad:
            return None
        return ValueError(
            f"{len(bad)} image file(s) cannot be decoded (not an image, truncated or corrupt): "
            + "; ".join(bad[:20]) + (" ..." if len(bad) > 20 else "")
            + ". Remove or fix them, or set --config.data.skip_bad=True to leave them out.")

    def input_remedy(self):
        """Decoding is the input work: cache it if it fits, else move it elsewhere."""
        c = self.config.data
        if c.service:
            return ("more tf.data service workers (data.service_workers, or workers on "
                    "other machines for data.service=grpc://...)")
        if c.format == "cifar10" or c.cache:
            return ("batches are gathered from memory; augmentation is the input work left: "
                    "data.augment=False, or more cores for the input pipeline" if c.augment
                    else "batches are gathered from memory: more cores for the input pipeline")
        gigabytes = len(self.data.kept("train")) * c.image_size**2 * 3 / 1e9
        if gigabytes < 0.25 * (available_memory_bytes() or 0) / 1e9:
            return f"data.cache=True decodes every image once into memory ({gigabytes:.2g} GB)"
        if self.data.source("train").python_reads:
            return (f"the decoded images ({gigabytes:.0f} GB) are too many to cache; as a "
                    "class folder, data.service=grpc://host:port could decode them on other "
                    "machines (docs/data.md#the-tfdata-service)")
        return ("data.service=grpc://host:port decodes on other machines "
                "(docs/data.md#the-tfdata-service); the decoded images "
                f"({gigabytes:.0f} GB) are too many to cache")

    def display_images(self, features):
        shift, scale = NORMALIZATIONS[self.config.data.normalization]
        return tf.clip_by_value((features * scale + shift) / 255.0, 0.0, 1.0)

    def serving_input(self):
        """uint8 images: CIFAR-10's 32x32, or of any size, resized as in training."""
        c = self.config.data
        if c.format == "cifar10":
            return (tf.TensorSpec([None, 32, 32, 3], tf.uint8, name="images"),
                    lambda images: normalize(images, c.normalization))

        def features(images):
            resized = tf.image.resize(images, [c.image_size, c.image_size])
            return normalize(tf.clip_by_value(tf.round(resized), 0, 255), c.normalization)

        return tf.TensorSpec([None, None, None, 3], tf.uint8, name="images"), features

    def compute_loss(self, labels, outputs):
        return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)

    def build_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]

    def update_metrics(self, metrics, labels, outputs):
        for metric in metrics:
            metric.update_state(labels, outputs)
