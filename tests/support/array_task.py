"""A regression Task on fixed arrays, served in order, and a Trainer on it: what the
tests of the step's math across replicas (test_replica_lockstep.py, test_accumulation.py,
test_ema.py) compare."""

import keras
import numpy as np
import tensorflow as tf

from support import tiny_config
from trainer import Trainer
from trainer.task import Task

PER_REPLICA = 4


def dense_model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1, dtype="float32")])


class Regression(Task):
    """Mean squared error, no metrics: the tasks of the tests of the step's math."""

    def compute_loss(self, labels, outputs):
        return tf.reduce_mean(tf.square(outputs - labels), axis=-1)

    def build_metrics(self):
        return []

    def update_metrics(self, metrics, labels, outputs):
        pass


class ArrayTask(Regression):
    """Regression on fixed arrays, batches served in order (replica 0, replica 1, ...)."""

    def __init__(self, config, x, y, model_fn=dense_model):
        super().__init__(config)
        self.x, self.y, self.model_fn = x, y, model_fn

    def build_model(self):
        return self.model_fn()

    def build_inputs(self, split, input_context, start_step=0):
        bs = input_context.get_per_replica_batch_size(self.config.data.global_batch_size)
        return tf.data.Dataset.from_tensor_slices((self.x, self.y)).batch(bs, drop_remainder=True)


def make_trainer(strategy, x, y, tmp_path, precision="float32", model_fn=dense_model,
                 **overrides):
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(1)
    config = tiny_config(**{"data.global_batch_size": 2 * PER_REPLICA,
                            "optimizer.name": "sgd", "optimizer.learning_rate": 0.1,
                            "optimizer.momentum": 0.0, **overrides})
    trainer = Trainer(config, ArrayTask(config, x, y, model_fn), strategy, str(tmp_path))
    return trainer, iter(trainer.distributed_dataset("train"))


def replica_weights(trainer, variables=None):
    """[replica][variable] numpy arrays (trainable variables unless `variables`)."""
    variables = trainer.model.trainable_variables if variables is None else variables
    per_var = [trainer.strategy.experimental_local_results(v.value) for v in variables]
    return [[r[i].numpy() for r in per_var] for i in range(len(per_var[0]))]


def data(steps, rng):
    x = rng.normal(size=(steps * 2 * PER_REPLICA, 3)).astype(np.float32)
    y = rng.normal(size=(steps * 2 * PER_REPLICA, 1)).astype(np.float32)
    return x, y


def assert_next_step_applies_alike(trainer, it, before):
    """After one skipped step: the next one changes the weights from `before`, the
    same on both replicas and finite, and is the first applied update."""
    trainer.train_loop(it, tf.constant(1, tf.int64))
    applied = replica_weights(trainer)
    assert any(not np.array_equal(a, b) for a, b in zip(applied[0], before[0]))
    for a0, a1 in zip(applied[0], applied[1]):
        np.testing.assert_array_equal(a0, a1)
        assert np.isfinite(a0).all()
    assert int(trainer.optimizer.iterations.numpy()) == 1
