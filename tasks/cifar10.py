"""CIFAR-10 image classification: the mixed-precision tutorial's CNN and a small ResNet."""

import keras
import tensorflow as tf
from absl import logging

from tasks import base, cifar10_data, register
from tasks.input_order import step_indexed_batches
from tasks.vit import vit, vit_train_flops

MEAN = (0.4914 * 255, 0.4822 * 255, 0.4465 * 255)
STD = (0.2470 * 255, 0.2435 * 255, 0.2616 * 255)


def seed_cnn(m=None, num_classes=10, image_size=32):
    """Exactly the CNN of the TensorFlow mixed-precision tutorial."""
    return keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(num_classes, dtype="float32"),  # float32 logits feed the loss
    ], name="seed_cnn")


def resnet(m, num_classes=10, image_size=32):
    """ResNet-20 style (He et al. 2016, CIFAR variant): 3 stages of `m.blocks_per_stage`
    basic blocks, widths m.width*(1, 2, 4). ~91% on CIFAR-10 with SGD+momentum, cosine LR,
    180 epochs."""
    width, blocks_per_stage, weight_decay = m.width, m.blocks_per_stage, m.weight_decay
    reg = keras.regularizers.L2(weight_decay / 2)  # gradient of wd/2*|w|^2 is wd*w

    def conv(filters, strides=1, kernel=3):
        return keras.layers.Conv2D(filters, kernel, strides, padding="same", use_bias=False,
                                   kernel_initializer="he_normal", kernel_regularizer=reg)

    def block(x, filters, strides):
        shortcut = x
        y = conv(filters, strides)(x)
        y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
        y = keras.layers.BatchNormalization()(conv(filters)(y))
        if strides != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.BatchNormalization()(conv(filters, strides, 1)(shortcut))
        return keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))

    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(conv(width)(inputs)))
    for stage in range(3):
        for i in range(blocks_per_stage):
            x = block(x, width * 2**stage, 2 if (stage and i == 0) else 1)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", kernel_regularizer=reg)(x)
    return keras.Model(inputs, outputs, name="resnet")


MODELS = {"seed_cnn": seed_cnn, "resnet": resnet, "vit": vit}


def random_crop_and_flip(images, seed):
    """Pad-4 random crop and horizontal flip of a batch [B, H, W, C], vectorized.

    Two batched gathers with per-image row and column indices (the flip is a
    reversed column order; indices into the zero padding read zeros), on the
    uint8 pixels: no per-image map and no interpolation, so the input
    pipeline keeps up with the step on 2 CPU cores. Stateless: `seed` [2]
    fixes the result.
    """
    batch, height, width = tf.shape(images)[0], images.shape[1], images.shape[2]
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    padded = tf.pad(images, [[0, 0], [4, 4], [4, 4], [0, 0]])
    corner = tf.random.stateless_uniform([batch, 2], crop_seed, 0, 9, dtype=tf.int32)
    rows = corner[:, :1] + tf.range(height)[tf.newaxis]
    offsets = tf.range(width)[tf.newaxis]
    flip = tf.random.stateless_uniform([batch, 1], flip_seed) < 0.5
    cols = corner[:, 1:] + tf.where(flip, width - 1 - offsets, offsets)
    crops = tf.gather(padded, rows, axis=1, batch_dims=1)
    return tf.gather(crops, cols, axis=2, batch_dims=1)


# (shift, scale) per `config.data.normalization`. unit_range (pixels / 255) is the
# tutorial's, and the right one for the seed CNN: standardized inputs made its first
# steps' loss ~4 and it learned far less in a few epochs (benchmarks/fit_parity.py).
# standardize (per-channel CIFAR-10 mean and std) is the usual one for BN ResNets and ViTs.
NORMALIZATIONS = {"unit_range": ((0.0, 0.0, 0.0), (255.0, 255.0, 255.0)),
                  "standardize": (MEAN, STD)}


def normalize(images, normalization):
    shift, scale = NORMALIZATIONS[normalization]
    return (tf.cast(images, tf.float32) - shift) / scale


# XLA fuses the gathers, the cast and the arithmetic into one pass over the batch:
# 0.9 ms instead of 6.5 ms for 512 images on this CPU, which leaves the cores to the
# train step (on 2 cores the input pipeline otherwise cost ~20% of throughput).
augment_and_normalize = tf.function(
    lambda images, seed, normalization: normalize(random_crop_and_flip(images, seed),
                                                  normalization), jit_compile=True)
normalize_fused = tf.function(normalize, jit_compile=True)


def train_batches(images, labels, batch_size, input_context, start_step, seed, augment,
                  normalization):
    """Per-replica train batches as a pure function of the step (see
    `step_indexed_batches`); augmentation is seeded by (seed, replica batch)."""
    images, labels = tf.constant(images), tf.constant(labels)

    def make_batch(indices, g):
        x = tf.gather(images, indices)
        x = (augment_and_normalize(x, tf.stack([tf.constant(seed, tf.int64), g]),
                                   normalization) if augment
             else normalize_fused(x, normalization))
        return x, tf.gather(labels, indices)

    return step_indexed_batches(len(labels), batch_size, input_context, start_step, seed,
                                make_batch)


@register("cifar10")
class Cifar10Task(base.Task):
    """Classifies 32x32 images into 10 classes."""

    def __init__(self, config):
        super().__init__(config)
        if config.model.name not in MODELS:
            raise ValueError(f"config.model.name={config.model.name!r} is unknown for task "
                             f"cifar10; choose one of {sorted(MODELS)}.")
        if config.data.normalization not in NORMALIZATIONS:
            raise ValueError(f"config.data.normalization={config.data.normalization!r} is "
                             f"unknown; choose one of {sorted(NORMALIZATIONS)}.")
        self._data = None

    @property
    def data(self):
        """The decoded arrays, loaded once per process."""
        if self._data is None:
            self._data = cifar10_data.load(self.config.data)
            logging.info("Data: %s (%d train, %d test images).", self._data.source,
                         len(self._data.train_labels), len(self._data.test_labels))
        return self._data

    def describe_data(self):
        return self.data.source

    def flops_per_example(self):
        """The ViT's by its formula; the CNNs' are counted on their graph."""
        return vit_train_flops(self.config.model) if self.config.model.name == "vit" else None

    def build_model(self):
        return MODELS[self.config.model.name](self.config.model)

    def build_inputs(self, split, input_context, start_step=0):
        batch_size = input_context.get_per_replica_batch_size(
            self.config.data.global_batch_size)
        if split == "train":
            n = len(self.data.train_labels)
            if self.config.data.global_batch_size > n:
                raise ValueError(
                    f"data.global_batch_size={self.config.data.global_batch_size} is larger "
                    f"than the {n} training examples; lower --config.data.global_batch_size.")
            ds = train_batches(self.data.train_images, self.data.train_labels, batch_size,
                               input_context, start_step, self.config.seed,
                               self.config.data.augment, self.config.data.normalization)
        else:
            ds = tf.data.Dataset.from_tensor_slices((self.data.test_images,
                                                     self.data.test_labels))
            if input_context.num_input_pipelines > 1:
                ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
            normalization = self.config.data.normalization
            ds = ds.batch(batch_size).map(lambda x, y: (normalize_fused(x, normalization), y),
                                          num_parallel_calls=tf.data.AUTOTUNE)
        return ds.prefetch(tf.data.AUTOTUNE)

    def input_remedy(self):
        if self.config.data.augment:
            return ("batches are gathered from memory; augmentation is the input work left: "
                    "data.augment=False, or more cores for the input pipeline")
        return "batches are gathered from memory: more cores for the input pipeline"

    def display_images(self, features):
        shift, scale = NORMALIZATIONS[self.config.data.normalization]
        return tf.clip_by_value((features * scale + shift) / 255.0, 0.0, 1.0)

    def serving_input(self):
        normalization = self.config.data.normalization
        return (tf.TensorSpec([None, 32, 32, 3], tf.uint8, name="images"),
                lambda images: normalize(images, normalization))

    def compute_loss(self, labels, outputs):
        return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)

    def build_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy")]

    def update_metrics(self, metrics, labels, outputs):
        for metric in metrics:
            metric.update_state(labels, outputs)
