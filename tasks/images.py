"""Image classification over files: a folder per class, TFRecord shards or a TFDS dataset.

The CIFAR task's models, augmentation and normalization on images of any count of
classes, resized to `data.image_size`. Train batches follow the step-indexed order of
tasks/input_order.py over the examples of tasks/image_sources.py: a resumed run reads
exactly what an uninterrupted one would, each input pipeline reads and decodes only its
own replica batches (the start-up pass of data.cache or data.skip_bad reads them all),
and the examples of a global step do not depend on the topology.
"""

import tensorflow as tf

from tasks import cifar10, data_service, register
from tasks.image_splits import image_splits, read_batch
from tasks.input_order import step_indexed_indices
from tasks.vit import vit_train_flops
from trainer.runtime.host import available_memory_bytes

AUTOTUNE = tf.data.AUTOTUNE


@register("images")
class ImagesTask(cifar10.Cifar10Task):
    """Classifies images read from files; see configs/images.py."""

    @property
    def data(self):
        return image_splits(self.config.data)

    def data_paths(self):
        c = self.config.data
        return tuple(p for p in (c.train, c.eval) if p) if c.format != "tfds" else ()

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
        kept = self.data.kept(split)
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
                return cifar10.augment_and_normalize(images, seed, c.normalization), labels
            return cifar10.normalize_fused(images, c.normalization), labels

        ds = ds.map(batch, AUTOTUNE)
        return (self._served(ds) if split == "train" else ds).prefetch(AUTOTUNE)

    def _served(self, train_batches):
        """Through the tf.data service if data.service is set (tasks/data_service.py)."""
        c = self.config.data
        if not c.service:
            return train_batches
        if c.cache:
            raise ValueError("data.cache=True leaves no decoding for data.service to take "
                             "over (and would send the decoded images to every service "
                             "worker): set one of them.")
        if self.data.source("train").python_reads and c.service != "local":
            raise ValueError(
                f"data.service={c.service!r} runs the input pipeline on other machines, "
                f"but {self.data.source('train').description} is read by Python code, "
                "which a pipeline sent to them cannot hold: use data.format=folder, or "
                "data.cache=True without the service.")
        return data_service.distribute(train_batches, c)

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
        if c.cache:
            return cifar10.Cifar10Task.input_remedy(self)
        gigabytes = len(self.data.kept("train")) * c.image_size**2 * 3 / 1e9
        if gigabytes < 0.25 * (available_memory_bytes() or 0) / 1e9:
            return f"data.cache=True decodes every image once into memory ({gigabytes:.2g} GB)"
        if self.data.source("train").python_reads:
            return (f"the decoded images ({gigabytes:.0f} GB) are too many to cache; as a "
                    "class folder, data.service=grpc://host:port could decode them on other "
                    "machines (BUILD.md, 'Input pipelines')")
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
