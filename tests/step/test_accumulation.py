"""Gradient accumulation: k micro-batches train exactly like one batch k times larger."""

import os
import sysconfig

import keras
import numpy as np
import pytest
import tensorflow as tf

from support import build, scalars, tiny_config, two_replicas
from support.array_task import (assert_next_step_applies_alike, data, make_trainer,
                                replica_weights)

STEPS, K = 3, 4


def regularized_model():
    """No dropout, no batch statistics (those differ by batch size), an L2 loss term."""
    return keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.05)),
        keras.layers.Dense(1, dtype="float32")])


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("clip_norm", [0.0, 0.05])
def test_accumulated_micro_batches_train_like_one_big_batch(tmp_path, replicas, clip_norm):
    strategy = two_replicas() if replicas == 2 else tf.distribute.get_strategy()
    x, y = data(STEPS * 2 * K, np.random.default_rng(0))  # 2 * PER_REPLICA rows a batch
    weights = {}
    for k in (1, K):
        trainer, it = make_trainer(
            strategy, x, y, tmp_path / str(k), model_fn=regularized_model,
            **{"data.global_batch_size": 32 // k, "trainer.accumulation_steps": k,
               "optimizer.momentum": 0.9, "optimizer.clip_norm": clip_norm})
        trainer.train_loop(it, tf.constant(STEPS, tf.int64))
        assert int(trainer.step.numpy()) == int(trainer.optimizer.iterations.numpy()) == STEPS
        if clip_norm:  # clipping did act
            assert float(trainer.grad_norm.result()) > 2 * clip_norm
        assert trainer.examples_per_step == 32
        assert trainer.model.losses  # the L2 term is in the loss
        weights[k] = replica_weights(trainer)
    for r in range(replicas):
        for big, accumulated in zip(weights[1][r], weights[K][r]):
            np.testing.assert_allclose(accumulated, big, rtol=1e-5, atol=1e-6)
    difference = max(np.abs(a - b).max() for a, b in zip(weights[1][0], weights[K][0]))
    print(f"max |weight difference| k=1 batch 32 vs k={K} batch {32 // K}, "
          f"{replicas} replica(s), clip_norm={clip_norm}: {difference:.3g}")


def test_an_overflow_in_one_micro_batch_skips_the_step_on_every_replica(tmp_path):
    x, y = data(2 * K, np.random.default_rng(1))
    # Step 1 reads per-replica batches 0..3 on replica 0 and 4..7 on replica 1: poison
    # the third micro-batch of replica 1, and (the loss scale must still move once) the
    # first of replica 0.
    x[(K + 2) * 4] = np.inf
    x[0] = np.inf
    trainer, it = make_trainer(two_replicas(), x, y, tmp_path, precision="mixed_float16",
                               **{"data.global_batch_size": 8,
                                  "trainer.accumulation_steps": K})
    before = replica_weights(trainer)
    scale = float(trainer.loss_scale.scale.numpy())
    trainer.train_loop(it, tf.constant(1, tf.int64))
    after = replica_weights(trainer)
    for r in range(2):
        for b, a in zip(before[r], after[r]):
            np.testing.assert_array_equal(a, b)
    assert float(trainer.loss_scale.scale.numpy()) == scale / 2  # once per optimizer step
    assert int(trainer.loss_scale.good_steps.numpy()) == 0
    assert int(trainer.loss_scale.skipped_steps.numpy()) == 1
    assert int(trainer.step.numpy()) == 1 and int(trainer.optimizer.iterations.numpy()) == 0

    # The next step starts from clean sums: it applies, finite and equal on both replicas.
    assert_next_step_applies_alike(trainer, it, before)


def test_resume_is_bitwise_equal_and_reads_the_stream_by_micro_batch(tmp_path):
    """Checkpoints fall between optimizer steps; the stream resumes at step * k
    micro-batches (at `step` it would read batches already trained on)."""
    config = tiny_config(**{"trainer.accumulation_steps": 3, "trainer.deterministic": True,
                            "trainer.train_steps": 6, "trainer.checkpoint_every": 3,
                            "trainer.eval_every": 0, "trainer.steps_per_loop": 3,
                            "data.global_batch_size": 16})
    uninterrupted = build(config, tmp_path / "a")
    uninterrupted.train(evaluate=False)
    interrupted = build(override_steps(config, 3), tmp_path / "b")
    interrupted.train(evaluate=False)
    resumed = build(config, tmp_path / "b")
    resumed.train(evaluate=False)
    assert int(resumed.step.numpy()) == 6
    for a, b in zip(uninterrupted.model.weights, resumed.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    logged = scalars(tmp_path / "a", "train")  # examples/sec counts 3 x 16 examples a step
    for (step, examples), (_, steps) in zip(sorted(logged["examples_per_sec"]),
                                            sorted(logged["steps_per_sec"])):
        assert examples == pytest.approx(48 * steps, rel=1e-6), step


def override_steps(config, steps):
    config = config.copy_and_resolve_references()
    config.trainer.train_steps = steps
    return config


def test_bad_accumulation_steps_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="accumulation_steps=0 must be an integer >= 1"):
        build(tiny_config(**{"trainer.accumulation_steps": 0}), tmp_path)


def test_every_step_reaches_tensorboard_inside_steps_per_loop(tmp_path):
    config = tiny_config(**{"trainer.per_step_summaries": True, "trainer.steps_per_loop": 5,
                            "trainer.train_steps": 20, "trainer.log_every": 7,
                            "trainer.eval_every": 0, "trainer.accumulation_steps": 2,
                            "optimizer.schedule": "cosine", "optimizer.warmup_steps": 5})
    build(config, tmp_path / "per_step").train(evaluate=False)
    train = scalars(tmp_path / "per_step", "train")
    for tag in ("loss", "learning_rate", "loss_scale", "grad_norm"):
        assert [s for s, _ in sorted(train[tag])] == list(range(1, 21)), tag
    # The other train scalars stay at the log steps (7 is no multiple of 5).
    assert [s for s, _ in sorted(train["accuracy"])] == [7, 14, 20]
    # The values are each step's own: as logged by a run that logs after every step.
    config.trainer.update(per_step_summaries=False, steps_per_loop=1, log_every=1)
    build(config, tmp_path / "every_step").train(evaluate=False)
    logged = scalars(tmp_path / "every_step", "train")
    for tag in ("loss", "learning_rate", "grad_norm"):
        np.testing.assert_allclose([v for _, v in sorted(train[tag])],
                                   [v for _, v in sorted(logged[tag])], rtol=1e-4, err_msg=tag)


@pytest.mark.parametrize("task_name", ["cifar10", "lm"])
def test_micro_batches_read_exactly_the_examples_of_the_big_batch(task_name):
    """accumulation_steps=4 at 8 sees what accumulation_steps=1 at 32 sees, step by step,
    also from a resumed step (the stream starts at step * k micro-batches)."""
    from trainer.task import get_task
    from configs import lm
    from trainer.step.accumulation import batch_micro_steps
    config = tiny_config() if task_name == "cifar10" else lm.get_config()
    if task_name == "lm":
        config.data.update(max_bytes=100_000, eval=os.path.join(
            sysconfig.get_paths()["stdlib"], "textwrap.py"))

    def step_examples(batch, k, start_step, pipelines, replicas):
        """The examples of optimizer step `start_step`, over every pipeline and replica
        (rows sorted: replicas and pipelines interleave the stream)."""
        config.data.global_batch_size = batch
        rows = []
        for p in range(pipelines):
            context = tf.distribute.InputContext(pipelines, p, replicas)
            dataset = get_task(config).build_inputs("train", context, start_step * k)
            for x, _ in batch_micro_steps(dataset, k).take(replicas // pipelines):
                rows.append(tf.reshape(x, [-1, int(np.prod(x.shape[-3 if task_name ==
                                                                  "cifar10" else -1:]))]))
        rows = np.concatenate(rows)
        return rows[np.lexsort(rows.T[::-1])]

    for pipelines, replicas in ((1, 1), (1, 2), (2, 2)):
        for start_step in (0, 5):
            np.testing.assert_array_equal(
                step_examples(32, 1, start_step, pipelines, replicas),
                step_examples(8, K, start_step, pipelines, replicas),
                err_msg=f"{pipelines} pipelines, {replicas} replicas, step {start_step}")


def test_per_step_summaries_of_successive_runs_in_one_process(tmp_path):
    """A compiled summary write holds the writer it was traced with: each run's own."""
    from trainer.runtime.summaries import Summaries
    for run in ("a", "b"):
        summaries = Summaries(str(tmp_path / run), True)
        summaries.per_step("train", ("loss", "grad_norm"), np.arange(6.0).reshape(3, 2), 4)
        del summaries
        assert scalars(tmp_path / run, "train") == {
            "loss": [(4, 0.0), (5, 2.0), (6, 4.0)], "grad_norm": [(4, 1.0), (5, 3.0), (6, 5.0)]}


def test_resuming_with_another_batch_per_step_warns_that_the_stream_moves(tmp_path, caplog):
    config = tiny_config(**{"trainer.train_steps": 2, "trainer.eval_every": 0})
    build(config, tmp_path).train(evaluate=False)
    assert "not where that run stopped" not in caplog.text
    resumed = override_steps(config, 4)
    resumed.trainer.accumulation_steps, resumed.data.global_batch_size = 2, 16
    build(resumed, tmp_path).train(evaluate=False)
    assert ("with data.global_batch_size, trainer.accumulation_steps = (16, 2), but the "
            "workdir was trained with (32, 1)") in caplog.text
