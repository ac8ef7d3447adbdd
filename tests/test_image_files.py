"""configs/images.py: class folders, TFRecord shards and TFDS read in the step-indexed
order (exact resume, shares per input pipeline, any topology), and bad input named."""

import hashlib
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import image_data
import tasks
from configs import images
from conftest import build, checkpoint_steps, override, two_replicas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("folder", "tfrecord", "tfds_array_record", "tfds_tfrecord")


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    """{format: data config fields} of the digits (1697 train, 100 eval) in every format."""
    root = tmp_path_factory.mktemp("digits")
    x, y = image_data.digits()
    train, test = slice(0, -100), slice(-100, None)
    out = {
        "folder": dict(format="folder",
                       train=image_data.write_folder(root / "train", x[train], y[train]),
                       eval=image_data.write_folder(root / "eval", x[test], y[test])),
        "tfrecord": dict(format="tfrecord", num_classes=10,
                         train=image_data.write_tfrecords(root / "rec" / "train", x[train],
                                                          y[train]),
                         eval=image_data.write_tfrecords(root / "rec" / "eval", x[test],
                                                         y[test], shards=1))}
    for file_format in ("array_record", "tfrecord"):
        name = image_data.prepare_tfds(root / file_format, x, y, file_format)
        out[f"tfds_{file_format}"] = dict(format="tfds", tfds_name=name, train="train",
                                          eval="test", tfds_data_dir=str(root / file_format))
    return out


def files_config(data, **overrides):
    """configs/images.py shrunk: 8px digits, the seed CNN, 20 steps of 32."""
    c = images.get_config()
    c.data.update(image_size=8, global_batch_size=32, augment=False,
                  normalization="unit_range", **data)
    c.model.name = "seed_cnn"
    c.precision = "float32"
    c.distribution.strategy = "default"
    c.optimizer.update(name="adam", learning_rate=1e-3, schedule="constant", warmup_steps=0)
    c.trainer.update(train_steps=20, steps_per_loop=5, log_every=5, eval_every=10,
                     checkpoint_every=10, per_step_summaries=False, jit_compile="off")
    return override(c, **overrides)


def fingerprints(images):
    """One hash per image: examples compared across batches, pipelines and formats."""
    return [hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest()[:12] for x in images]


def examples(features, labels):
    """Sorted (pixel hash, label) of unit_range features of the 1-channel digits."""
    pixels = np.round(np.asarray(features) * 255).astype(np.uint8)
    np.testing.assert_array_equal(pixels[..., 0], pixels[..., 2])  # gray -> 3 channels
    return sorted(zip(fingerprints(pixels[..., :1]), np.asarray(labels).tolist()))


def digits_examples(part):
    x, y = image_data.digits()
    return sorted(zip(fingerprints(x[part]), y[part].tolist()))


def context(pipelines=1, pipeline=0, replicas=1):
    return tf.distribute.InputContext(pipelines, pipeline, replicas)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_the_same_pixels_and_labels(digits_files, fmt):
    task = tasks.get_task(files_config(digits_files[fmt]))
    assert task.data.num_classes == 10
    batches = list(task.build_inputs("eval", context()).as_numpy_iterator())
    x = np.concatenate([b[0] for b in batches])
    assert x.shape == (100, 8, 8, 3)
    assert examples(x, np.concatenate([b[1] for b in batches])) == digits_examples(
        slice(-100, None))


@pytest.mark.parametrize("fmt", FORMATS)
def test_train_stream_resumes_at_the_step_and_splits_across_pipelines(digits_files, fmt):
    """Two pipelines (1 replica each) read, step by step, what one pipeline with 2
    replicas reads; from start_step=k the stream is the tail of the one from 0; an
    epoch holds every example once."""
    task = tasks.get_task(files_config(digits_files[fmt]))
    one = list(task.build_inputs("train", context(1, 0, 2)).take(2 * 60).as_numpy_iterator())
    parts = [list(task.build_inputs("train", context(2, p, 2)).take(60).as_numpy_iterator())
             for p in range(2)]
    for k in range(60):  # step k: replica batches 2k, 2k+1
        for r in range(2):
            np.testing.assert_array_equal(one[2 * k + r][0], parts[r][k][0])
            np.testing.assert_array_equal(one[2 * k + r][1], parts[r][k][1])
    resumed = list(task.build_inputs("train", context(1, 0, 2), 7).take(4).as_numpy_iterator())
    for a, b in zip(one[14:], resumed):
        np.testing.assert_array_equal(a[0], b[0])
    first_epoch = [np.concatenate([b[i] for b in one])[:1697] for i in range(2)]
    assert examples(*first_epoch) == digits_examples(slice(0, -100))
