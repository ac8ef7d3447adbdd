"""Image preprocessing shared by every image source: pad-4 crops and flips, the
normalizations, and in-memory train batches in the step-indexed order."""

import tensorflow as tf

from trainer.data.order import step_indexed_batches

# CIFAR-10's per-channel mean and standard deviation, in pixel units.
MEAN = (0.4914 * 255, 0.4822 * 255, 0.4465 * 255)
STD = (0.2470 * 255, 0.2435 * 255, 0.2616 * 255)


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
