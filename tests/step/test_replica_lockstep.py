"""Two replicas must take one decision per step and match one replica's update."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.task import get_task
from support import tiny_config, two_replicas
from support.array_task import (PER_REPLICA, assert_next_step_applies_alike, data,
                                make_trainer, replica_weights)
from trainer import Trainer
from trainer.loop.divergence import check_finite

def test_overflow_on_one_replica_is_skipped_on_both(tmp_path):
    x, y = data(2, np.random.default_rng(0))
    x[PER_REPLICA] = np.inf  # first example of replica 1's batch in step 1
    trainer, it = make_trainer(two_replicas(), x, y, tmp_path, precision="mixed_float16")
    before = replica_weights(trainer)
    scale = trainer.loss_scale.scale.numpy()

    trainer.train_loop(it, tf.constant(1, tf.int64))
    after = replica_weights(trainer)
    for r in range(2):
        for b, a in zip(before[r], after[r]):
            np.testing.assert_array_equal(a, b)
            assert np.isfinite(a).all()
    assert trainer.loss_scale.scale.numpy() == scale / 2
    assert trainer.loss_scale.skipped_steps.numpy() == 1
    assert int(trainer.optimizer.iterations.numpy()) == 0
    assert int(trainer.step.numpy()) == 1

    assert_next_step_applies_alike(trainer, it, before)
    assert trainer.loss_scale.skipped_steps.numpy() == 1


@pytest.mark.parametrize("clip_norm", [0.0, 0.05])
def test_two_replicas_match_one_replica(tmp_path, clip_norm):
    """Gradients are summed exactly once and clipped by the global norm of that sum."""
    x, y = data(2, np.random.default_rng(1))
    results = []
    for name, strategy in [("one", tf.distribute.get_strategy()), ("two", two_replicas())]:
        trainer, it = make_trainer(strategy, x, y, tmp_path / name,
                                   **{"optimizer.clip_norm": clip_norm})
        variables = trainer.model.trainable_variables
        before = [v.numpy() for v in variables]
        with tf.GradientTape() as tape:  # the first step's global batch, by hand
            loss = tf.reduce_mean(tf.square(trainer.model(x[:2 * PER_REPLICA])
                                            - y[:2 * PER_REPLICA]))
        grads = [g.numpy() for g in tape.gradient(loss, variables)]
        norm = float(tf.linalg.global_norm(grads))
        trainer.train_loop(it, tf.constant(1, tf.int64))
        np.testing.assert_allclose(trainer.grad_norm.result().numpy(), norm, rtol=1e-5)
        if clip_norm:
            assert norm > 2 * clip_norm  # clipping acts
        scale = min(1.0, clip_norm / norm) if clip_norm else 1.0
        for v, b, g in zip(variables, before, grads):  # SGD, learning rate 0.1
            np.testing.assert_allclose(v.numpy(), b - 0.1 * scale * g, rtol=1e-5, atol=1e-7)
        trainer.train_loop(it, tf.constant(1, tf.int64))
        results.append([v.numpy() for v in variables])
    for one, two in zip(*results):
        np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-6)


def test_batch_norm_statistics_are_identical_on_every_replica(tmp_path):
    """BN's moving statistics are per-replica variables in Keras 3; the step averages them."""
    config = tiny_config(**{"model.name": "resnet", "model.width": 4,
                            "model.blocks_per_stage": 1, "data.global_batch_size": 16})
    keras.utils.set_random_seed(0)
    trainer = Trainer(config, get_task(config), two_replicas(), str(tmp_path))
    it = iter(trainer.distributed_dataset("train"))
    trainer.train_loop(it, tf.constant(3, tf.int64))
    stats = [v for v in trainer.model.variables if "moving_" in v.path]
    assert len(stats) >= 6
    r0, r1 = replica_weights(trainer, trainer.model.variables)
    for v, a, b in zip(trainer.model.variables, r0, r1):
        np.testing.assert_array_equal(a, b, err_msg=v.path)
    moved = [a for v, a in zip(trainer.model.variables, r0) if v.path.endswith("moving_mean")]
    assert any(np.abs(m).max() > 0 for m in moved)  # the statistics did move


def batch_norm_model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                             keras.layers.BatchNormalization(), keras.layers.Activation("tanh"),
                             keras.layers.Dense(1, dtype="float32")])


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_skipped_step_changes_no_variable(tmp_path, replicas):
    x, y = data(3, np.random.default_rng(2))
    x[2 * PER_REPLICA + 1] = np.inf  # step 2's batch: a non-finite forward pass
    strategy = two_replicas() if replicas == 2 else tf.distribute.get_strategy()
    trainer, it = make_trainer(strategy, x, y, tmp_path, model_fn=batch_norm_model,
                               **{"trainer.max_nonfinite_steps": 5})
    trainer.train_loop(it, tf.constant(1, tf.int64))
    before = replica_weights(trainer, trainer.model.variables)
    trainer.train_loop(it, tf.constant(1, tf.int64))
    for r, (b, a) in enumerate(zip(before, replica_weights(trainer, trainer.model.variables))):
        for v, vb, va in zip(trainer.model.variables, b, a):
            np.testing.assert_array_equal(va, vb, err_msg=f"{v.path} replica {r}")
    assert int(trainer.loss_scale.skipped_steps.numpy()) == 1
    check_finite(trainer, 2)  # within max_nonfinite_steps: training goes on
    trainer.train_loop(it, tf.constant(1, tf.int64))
    after = replica_weights(trainer, trainer.model.variables)[0]
    for v, vb, va in zip(trainer.model.variables, before[0], after):
        assert not np.array_equal(va, vb), f"{v.path} not updated by the next step"
    assert int(trainer.optimizer.iterations.numpy()) == 2


def embedding_model():
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(5, 2),
                             keras.layers.Flatten(), keras.layers.Dense(1, dtype="float32")])


def test_sparse_gradients_clip_like_dense_ones(tmp_path):
    """Embedding gradients (IndexedSlices) with duplicate indices: the norm that clips is
    the norm of the summed (dense) gradient, and 2 replicas train like 1."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 2, size=(2 * 2 * PER_REPLICA, 3)).astype(np.int32)  # many duplicates
    y = rng.normal(size=(len(x), 1)).astype(np.float32) * 10
    results = []
    for name, strategy in [("one", tf.distribute.get_strategy()), ("two", two_replicas())]:
        trainer, it = make_trainer(strategy, x, y, tmp_path / name, model_fn=embedding_model,
                                   **{"optimizer.clip_norm": 0.1})
        batch = slice(0, 2 * PER_REPLICA)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(trainer.model(x[batch]) - y[batch]))
        dense = [tf.convert_to_tensor(g) for g in tape.gradient(
            loss, trainer.model.trainable_variables)]
        trainer.train_loop(it, tf.constant(1, tf.int64))
        np.testing.assert_allclose(trainer.grad_norm.result().numpy(),
                                   tf.linalg.global_norm(dense).numpy(), rtol=1e-5)
        assert trainer.grad_norm.result().numpy() > 0.1  # clipping was active
        trainer.train_loop(it, tf.constant(1, tf.int64))
        results.append([v.numpy() for v in trainer.model.trainable_variables])
    for one, two in zip(*results):
        np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-6)


class RecordMask(keras.layers.Layer):
    """Passes its input through; records which entries are zero, per replica, as the
    compiled train step runs (a py_function: the host sees the real step's masks)."""

    def __init__(self, masks):
        super().__init__()
        self.add = lambda replica, mask: masks.setdefault(replica, []).append(mask)  # (a
        # dict attribute would be a copy: Keras wraps those it tracks)

    def compute_output_shape(self, input_shape):
        return input_shape

    def call(self, x):
        def record(replica, value):
            self.add(int(replica), value.numpy() == 0)
            return 0

        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        tf.py_function(record, [replica, x], tf.int32)
        return x


def test_replicas_draw_distinct_dropout_masks(tmp_path):
    x = np.ones((4 * PER_REPLICA, 3), np.float32)  # the same examples on both replicas
    masks = {}
    model_fn = lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(64),
                                         keras.layers.Dropout(0.5), RecordMask(masks),
                                         keras.layers.Dense(1, dtype="float32")])
    trainer, it = make_trainer(two_replicas(), x, x[:, :1], tmp_path, model_fn=model_fn)
    trainer.train_loop(it, tf.constant(2, tf.int64))  # the real step, twice
    assert sorted(masks) == [0, 1] and [len(m) for m in masks.values()] == [2, 2]
    for step in range(2):
        assert 0.3 < masks[0][step].mean() < 0.7  # dropout 0.5 acted
        assert not np.array_equal(masks[0][step], masks[1][step]), step
    assert not np.array_equal(masks[0][0], masks[0][1])  # and steps differ


def test_grad_norm_of_a_window_with_a_skipped_step_is_the_mean_of_the_finite_ones(tmp_path):
    x, y = data(3, np.random.default_rng(4))
    x[2 * PER_REPLICA] = np.inf  # step 2 is skipped
    overrides = {"trainer.max_nonfinite_steps": 5}
    stepwise, it = make_trainer(two_replicas(), x, y, tmp_path / "a", **overrides)
    norms = []
    for _ in range(3):
        stepwise.train_loop(it, tf.constant(1, tf.int64))
        norms.append(stepwise.grad_norm.result().numpy())
        stepwise.grad_norm.reset_state()
    window, it = make_trainer(two_replicas(), x, y, tmp_path / "b", **overrides)
    window.train_loop(it, tf.constant(3, tf.int64))
    assert int(window.loss_scale.skipped_steps.numpy()) == 1
    logged = window.grad_norm.result().numpy()
    assert np.isfinite(logged)
    np.testing.assert_allclose(logged, (norms[0] + norms[2]) / 2, rtol=1e-6)


def test_the_schedule_follows_the_step_and_ends_at_train_steps(tmp_path):
    """Skipped steps count: a cosine schedule reaches 0 at train_steps all the same."""
    steps = 6
    x, y = data(steps, np.random.default_rng(5))
    x[0] = np.inf  # the first step is skipped
    trainer, _ = make_trainer(tf.distribute.get_strategy(), x, y, tmp_path, **{
        "trainer.train_steps": steps, "trainer.max_nonfinite_steps": 5,
        "optimizer.schedule": "cosine", "optimizer.warmup_steps": 0})
    trainer.train(evaluate=False)
    assert int(trainer.step.numpy()) == steps
    assert int(trainer.optimizer.iterations.numpy()) == steps - 1
    assert float(tf.convert_to_tensor(trainer.optimizer.learning_rate)) == pytest.approx(0.0)


def test_a_renamed_keras_hook_fails_at_optimizer_build(monkeypatch, tmp_path):
    """Were Keras to rename the method, gradients would silently be reduced twice."""
    from trainer.runtime import keras_internals as optimizers
    monkeypatch.setattr(optimizers, "ALL_REDUCE_HOOK", "_all_reduce_renamed")
    x, y = data(1, np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="_all_reduce_renamed.*pinned in pyproject"):
        make_trainer(tf.distribute.get_strategy(), x, y, tmp_path)
