"""Models made to go non-finite in a known layer at a known step, for the divergence
diagnosis (tests/loop/test_diagnosis.py). Their inputs grow with the step (a pure
function of it, as every task's order is), so the step where a layer breaks is chosen
by the arithmetic below, not by chance."""

import keras
import tensorflow as tf

from support import tiny_config
from support.array_task import Regression

FAILING_STEP = 7  # each model's first non-finite step; the checkpoint before it is ckpt-4


class SafeLog(keras.layers.Layer):
    """log(x) where x > 0, else 0: finite forward, but at x = 0 the untaken branch's
    derivative 1/x is inf, and 0 * inf is NaN in the backward pass."""

    def call(self, x):
        return tf.where(x > 0, tf.math.log(x), tf.zeros_like(x))


def overflow_dense():
    """`overflow`'s float16 output is 16 * 600 * step: 57,600 at step 6, past float16's
    65,504 at step 7."""
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(4, use_bias=False, name="spread",
                           kernel_initializer=keras.initializers.Constant(0.25)),
        keras.layers.Dense(4, use_bias=False, name="overflow",
                           kernel_initializer=keras.initializers.Constant(4.0)),
        keras.layers.Dense(1, dtype="float32", name="out", kernel_initializer="zeros")],
        name="made_to_fail")


def nested_overflow():
    """overflow_dense's layers inside a Functional backbone inside the model: Keras gives
    the inner layers no path prefix of the backbone's."""
    inner = overflow_dense()
    backbone = keras.Model(inner.inputs, inner.layers[1].output, name="backbone")
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(1, dtype="float32", name="head",
                                 kernel_initializer="zeros")(backbone(inputs))
    return keras.Model(inputs, outputs, name="made_to_fail")


def log_of_zero():
    """`hidden` has no bias, so at the step whose inputs are 0 its output is exactly 0."""
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(4, use_bias=False, name="hidden",
                           kernel_initializer=keras.initializers.Constant(0.25)),
        SafeLog(name="safe_log"),
        keras.layers.Dense(1, name="out")], name="made_to_fail")


def large_logits():
    """The attention's query-key products 8 * (8 * 1.8 * step)^2 (kernels of ones, inputs
    of 1.8 * step): 59,720 at step 6, past float16's largest at step 7."""
    inputs = keras.Input((4, 8))
    ones = keras.initializers.Constant(1.0)
    attention = keras.layers.MultiHeadAttention(
        1, 8, name="attention", kernel_initializer=ones)(inputs, inputs)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(attention)
    outputs = keras.layers.Dense(1, dtype="float32", name="out",
                                 kernel_initializer="zeros")(pooled)
    return keras.Model(inputs, outputs, name="made_to_fail")


CASES = {
    # name: (model, precision, inputs of (step, shape))
    "overflow_dense": (overflow_dense, "mixed_float16",
                       lambda step, shape: tf.fill(shape, 600.0 * tf.cast(step, tf.float32))),
    "log_of_zero": (log_of_zero, "float32",
                    lambda step, shape: tf.fill(shape, tf.cast(step != FAILING_STEP,
                                                               tf.float32))),
    "nested_overflow": (nested_overflow, "mixed_float16",
                        lambda step, shape: tf.fill(shape, 600.0 * tf.cast(step, tf.float32))),
    "nan_input": (log_of_zero, "float32",  # the batch of the failing step holds a NaN
                  lambda step, shape: tf.fill(shape, tf.where(
                      step == FAILING_STEP, float("nan"), 1.0))),
    "large_logits": (large_logits, "mixed_float16",
                     lambda step, shape: tf.fill(shape, 1.8 * tf.cast(step, tf.float32))),
}


class MadeToFail(Regression):
    """Regression to 0 on inputs that are a function of the step (1-based)."""

    def __init__(self, config, case):
        super().__init__(config)
        self.model_fn, _, self.inputs = CASES[case]
        self.shape = (4, 8) if case == "large_logits" else (4,)

    def build_model(self):
        return self.model_fn()

    def build_inputs(self, split, input_context, start_step=0):
        """Replica batch g of the global stream belongs to step g // replicas + 1."""
        batch = input_context.get_per_replica_batch_size(self.config.data.global_batch_size)
        replicas = input_context.num_replicas_in_sync
        pipelines = input_context.num_input_pipelines

        def example(k):
            g = k * pipelines + input_context.input_pipeline_id
            step = g // replicas + 1
            return (self.inputs(step, [batch, *self.shape]), tf.zeros([batch, 1]))

        return tf.data.Dataset.range(start_step * replicas // pipelines, 1 << 40).map(example)


def made_to_fail_config(case, **overrides):
    """Checkpoints every 4 steps, a chunk per step, two non-finite steps in a row stop."""
    return tiny_config(**{
        "precision": CASES[case][1], "data.global_batch_size": 4,
        "optimizer.name": "sgd", "optimizer.learning_rate": 1e-9, "optimizer.momentum": 0.0,
        "trainer.train_steps": 12, "trainer.steps_per_loop": 1, "trainer.checkpoint_every": 4,
        "trainer.log_every": 4, "trainer.max_nonfinite_steps": 2, **overrides})
