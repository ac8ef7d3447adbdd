"""TwoHeads: a Task whose branch underflows in float16 (the precision check's and the
numerics telemetry's case)."""

import keras
import tensorflow as tf

from trainer.task import Task


class ScaledDense(keras.layers.Dense):
    """A Dense whose output is scaled by a constant in its compute dtype (1e-12 is 0 in
    float16, not in float32)."""

    def __init__(self, units, factor, **kwargs):
        super().__init__(units, **kwargs)
        self.factor = factor

    def call(self, x):
        return super().call(x) * tf.cast(self.factor, self.compute_dtype)


class TwoHeads(Task):
    """Sign of a sum, from a main head plus a branch whose output is scaled by `factor`
    before the loss: at 1e-12 the branch's gradients vanish in float16, not in float32."""

    def __init__(self, config, factor):
        super().__init__(config)
        self.factor = factor

    def build_model(self):
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
        main = keras.layers.Dense(2, name="main")(hidden)
        branch = ScaledDense(2, self.factor, name="branch")(hidden)
        logits = keras.layers.Add(dtype="float32", name="logits")([main, branch])
        return keras.Model(inputs, logits, name="two_heads")

    def build_inputs(self, split, input_context, start_step=0):
        x = tf.random.stateless_normal((256, 8), seed=(1, 2))
        y = tf.cast(tf.reduce_sum(x, axis=1) > 0, tf.int32)
        batch = input_context.get_per_replica_batch_size(self.config.data.global_batch_size)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)

    def compute_loss(self, labels, outputs):
        return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)

    def build_metrics(self):
        return []

    def update_metrics(self, metrics, labels, outputs):
        pass
