"""Loss scaling for float16 training, owned by the Trainer.

Why our own and not `keras.optimizers.LossScaleOptimizer`: Keras 3's wrapper
has no `get_scaled_loss` / `get_unscaled_gradients`, and it decides
finiteness on each replica's *local* gradients. Under MirroredStrategy with
two replicas an overflow on one replica wrote `-inf` into the weights and
left the scale unchanged. Here the Trainer all-reduces the gradients once and
calls `update(finite)` with a decision taken on the *reduced* gradients, so
every replica skips or applies the same step.
"""

import tensorflow as tf


def all_finite(grads):
    """True when every gradient entry is finite (a scalar bool tensor)."""
    checks = []
    for g in grads:
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            g = g.values
        checks.append(tf.reduce_all(tf.math.is_finite(g)))
    return tf.reduce_all(tf.stack(checks))


class LossScale(tf.Module):
    """Dynamic or static loss scale with checkpointable state.

    Dynamic: start at `initial_scale`, double after `growth_steps` finite
    steps in a row, halve (never below 1) on a non-finite step. Static: the
    scale never changes. Disabled (float32 / bfloat16): the scale is 1 and
    scaling is the identity. In every mode a non-finite step is skipped and
    counted in `skipped_steps`, so no NaN ever reaches the weights.
    """

    def __init__(self, enabled, dynamic=True, initial_scale=2.0**15,
                 growth_steps=2000):
        super().__init__(name="loss_scale")
        if initial_scale <= 0:
            raise ValueError(f"loss_scale.initial_scale must be > 0, got {initial_scale}.")
        if growth_steps < 1:
            raise ValueError(f"loss_scale.growth_steps must be >= 1, got {growth_steps}.")
        self.enabled = bool(enabled)
        self.dynamic = bool(dynamic) and self.enabled
        self.growth_steps = int(growth_steps)
        self.initial_scale = float(initial_scale)
        variable = lambda value, dtype, name: tf.Variable(
            value, dtype=dtype, name=name, trainable=False,
            synchronization=tf.VariableSynchronization.ON_WRITE,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.scale = variable(initial_scale if self.enabled else 1.0, tf.float32, "scale")
        self.good_steps = variable(0, tf.int64, "good_steps")
        self.skipped_steps = variable(0, tf.int64, "skipped_steps")
        # Checkpointed, so a resumed run knows whether `scale` was in use when saved.
        self.was_enabled = variable(int(self.enabled), tf.int64, "enabled")

    def after_restore(self, policy):
        """Reconciles a restored scale with this run's precision; returns a log line.

        A checkpoint of a run without float16 loss scaling holds the scale 1,
        which would underflow float16 gradients: the scale starts afresh.
        """
        was_enabled, scale = bool(self.was_enabled.numpy()), float(self.scale.numpy())
        self.was_enabled.assign(int(self.enabled))
        if self.enabled and not was_enabled:
            self.scale.assign(self.initial_scale)
            self.good_steps.assign(0)
            return (f"Loss scale starts at {self.initial_scale:g} (loss_scale.initial_scale): "
                    f"the checkpoint was trained without float16 loss scaling, so it holds "
                    f"no scale for {policy}.")
        if was_enabled and not self.enabled:
            self.scale.assign(1.0)
            return (f"Loss scaling is off under {policy}; the checkpoint's float16 loss scale "
                    f"{scale:g} is not used.")
        if self.enabled:
            return f"Loss scale resumes at {scale:g} from the checkpoint."
        return None

    def get_scaled_loss(self, loss):
        if not self.enabled:
            return loss
        return loss * tf.cast(self.scale, loss.dtype)

    def get_unscaled_gradients(self, grads):
        if not self.enabled:
            return grads
        inv = 1.0 / self.scale
        def unscale(g):
            if g is None:
                return None
            if isinstance(g, tf.IndexedSlices):
                return tf.IndexedSlices(g.values * tf.cast(inv, g.values.dtype),
                                        g.indices, g.dense_shape)
            return g * tf.cast(inv, g.dtype)
        return [unscale(g) for g in grads]

    def update(self, finite):
        """Records one step; returns `finite` (whether the step is applied).

        Call it once per step in cross-replica context (the Trainer does so
        inside `merge_call`), with the same `finite` for all replicas.
        """
        finite = tf.convert_to_tensor(finite)
        self.skipped_steps.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        if self.dynamic:
            good = tf.where(finite, self.good_steps + 1, tf.zeros_like(self.good_steps))
            grow = good >= self.growth_steps
            doubled = self.scale * 2.0
            scale = tf.where(
                finite,
                tf.where(grow & tf.math.is_finite(doubled), doubled, self.scale),
                tf.maximum(self.scale * 0.5, 1.0))
            self.scale.assign(scale)
            self.good_steps.assign(tf.where(grow, tf.zeros_like(good), good))
        return finite
