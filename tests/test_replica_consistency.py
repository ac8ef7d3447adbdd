"""Two replicas must take one decision per step and match one replica's update."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_config, two_replicas
from tasks.base import Task
from trainer import Trainer

PER_REPLICA = 4


class ArrayTask(Task):
    """Regression on fixed arrays, batches served in order (replica 0, replica 1, ...)."""

    def __init__(self, config, x, y):
        super().__init__(config)
        self.x, self.y = x, y

    def build_model(self):
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                                 keras.layers.Dense(1, dtype="float32")])

    def build_inputs(self, split, input_context, start_step=0):
        bs = input_context.get_per_replica_batch_size(self.config.data.global_batch_size)
        return tf.data.Dataset.from_tensor_slices((self.x, self.y)).batch(bs, drop_remainder=True)

    def compute_loss(self, labels, outputs):
        return tf.reduce_mean(tf.square(outputs - labels), axis=-1)

    def build_metrics(self):
        return []

    def update_metrics(self, metrics, labels, outputs):
        pass


def make_trainer(strategy, x, y, tmp_path, precision="float32", **overrides):
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(1)
    config = tiny_config(**{"data.global_batch_size": 2 * PER_REPLICA,
                            "optimizer.name": "sgd", "optimizer.learning_rate": 0.1,
                            "optimizer.momentum": 0.0, **overrides})
    trainer = Trainer(config, ArrayTask(config, x, y), strategy, str(tmp_path))
    return trainer, iter(trainer.distributed_dataset("train"))


def replica_weights(trainer):
    """[replica][variable] numpy arrays."""
    per_var = [trainer.strategy.experimental_local_results(v.value)
               for v in trainer.model.trainable_variables]
    return [[r[i].numpy() for r in per_var] for i in range(len(per_var[0]))]


def data(steps, rng):
    x = rng.normal(size=(steps * 2 * PER_REPLICA, 3)).astype(np.float32)
    y = rng.normal(size=(steps * 2 * PER_REPLICA, 1)).astype(np.float32)
    return x, y


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

    trainer.train_loop(it, tf.constant(1, tf.int64))
    applied = replica_weights(trainer)
    assert any(not np.array_equal(a, b) for a, b in zip(applied[0], before[0]))
    for a0, a1 in zip(applied[0], applied[1]):
        np.testing.assert_array_equal(a0, a1)
        assert np.isfinite(a0).all()
    assert int(trainer.optimizer.iterations.numpy()) == 1
    assert trainer.loss_scale.skipped_steps.numpy() == 1


@pytest.mark.parametrize("clip_norm", [0.0, 0.05])
def test_two_replicas_match_one_replica(tmp_path, clip_norm):
    """Gradients are summed exactly once and clipped by the global norm of that sum."""
    x, y = data(2, np.random.default_rng(1))
    results = []
    for name, strategy in [("one", tf.distribute.get_strategy()), ("two", two_replicas())]:
        trainer, it = make_trainer(strategy, x, y, tmp_path / name,
                                   **{"optimizer.clip_norm": clip_norm})
        trainer.train_loop(it, tf.constant(2, tf.int64))
        results.append([v.numpy() for v in trainer.model.trainable_variables])
        grad_norm = trainer.grad_norm.result().numpy()
        assert grad_norm > 0
    for one, two in zip(*results):
        np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-6)
