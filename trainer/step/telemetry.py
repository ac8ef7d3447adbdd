"""Numerics telemetry: statistics recorded inside the compiled step every
`numerics.every` steps (`trainer/actions/numerics_log.py` writes them under `numerics/` in
TensorBoard and reports the layers at risk at the end of the run).

Gradient statistics come from the gradients the step already has (after the
all-reduce, so every replica holds the same): the unscaled norm, the fraction of
entries that are exactly zero, a histogram of log2 |scaled gradient| and, under
float16, the smallest non-zero and largest magnitude of the *scaled* gradient, from
which each layer's headroom is read: powers of two above float16's smallest
subnormal (2^-24) and below its largest value (65504). Activation statistics are
each layer's output in its compute dtype: largest finite magnitude (max over
replicas), fractions of zeros and of infs/NaNs (mean over replicas).
With `every = 0` none of this is traced into the step.
"""

import contextlib
import math

import tensorflow as tf


FLOAT16_TINY, FLOAT16_MAX = 2.0**-24, 65504.0
# ReLU layers have many exactly-zero gradient entries in any precision; almost all
# zero under float16 is worth a --mode=precision_check. Headroom below 65504 is
# reported, not judged: dynamic loss scaling keeps it small on purpose.
MIN_HEADROOM_BITS, MOSTLY_ZERO = 2.0, 0.9
# Histogram bins of log2 |scaled gradient|, one per power of two; the edge bins take
# everything beyond them. float16 underflows below bin -24.
LOG2_LOW, LOG2_BINS = -48, 64


class ActivationProbe:
    """Hands each layer's output to the step while a `capture()` is open.

    Keras 3 has no forward hooks, so each layer's `call` is wrapped on the instance
    (its class and its weights are untouched). Outside a capture the wrapper only
    passes the outputs through.
    """

    def __init__(self, layers):
        self.paths = [layer.path for layer in layers]
        self.seen = set()  # paths of the layers the traced forward pass called
        self._captured = None
        for layer in layers:
            self._wrap(layer)

    def _wrap(self, layer):
        original, path = layer.call, layer.path

        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            if self._captured is not None:
                self._captured.setdefault(path, []).append(outputs)
            return outputs

        object.__setattr__(layer, "call", call)  # (not a tracked attribute)

    @contextlib.contextmanager
    def capture(self):
        self._captured = {}
        try:
            yield self._captured
        finally:
            self._captured = None

    def statistics(self, captured, record):
        """[layers, 3]: max finite |output|, zero and non-finite fractions per layer;
        computed only when `record` (zeros otherwise)."""
        self.seen |= set(captured)

        def compute():
            with tf.name_scope("numerics"):
                rows = [_output_statistics(captured[p]) if p in captured else tf.zeros([3])
                        for p in self.paths]
                return tf.stack(rows)

        return tf.cond(record, compute, lambda: tf.zeros([self.rows, 3]))

    @property
    def rows(self):
        """Rows of `statistics`: one per layer."""
        return len(self.paths)


def _output_statistics(outputs):
    tensors = [tf.reshape(t, [-1]) for t in tf.nest.flatten(outputs)
               if isinstance(t, tf.Tensor) and t.dtype.is_floating]
    if not tensors:
        return tf.zeros([3])
    size = tf.add_n([tf.cast(tf.size(t), tf.float32) for t in tensors])
    finite = [tf.math.is_finite(t) for t in tensors]
    largest = tf.reduce_max(tf.stack([
        tf.cast(tf.reduce_max(tf.where(f, tf.abs(t), tf.zeros_like(t))), tf.float32)
        for t, f in zip(tensors, finite)]))
    zeros = tf.add_n([tf.reduce_sum(tf.cast(tf.equal(t, 0), tf.float32)) for t in tensors])
    nonfinite = tf.add_n([tf.reduce_sum(tf.cast(tf.logical_not(f), tf.float32))
                          for f in finite])
    return tf.stack([largest, zeros / size, nonfinite / size])


def layer_of(variable_path):
    return variable_path.rsplit("/", 1)[0]


def check_numerics_every(every):
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise ValueError(f"numerics.every={every!r} must be an integer >= 0 (0: off).")
    return every


class Telemetry:
    """The statistics' variables (not checkpointed) and the compiled code that fills them."""

    def __init__(self, variables, layers, every):
        self.paths, self.every = [v.path for v in variables], every
        self.activations = ActivationProbe(layers)
        zeros = tf.zeros([len(variables)])
        with tf.name_scope("numerics"):
            self.norm = tf.Variable(zeros, trainable=False, name="grad_norm")
            self.zero_fraction = tf.Variable(zeros, trainable=False, name="grad_zero_fraction")
            self.smallest = tf.Variable(zeros, trainable=False, name="scaled_grad_smallest")
            self.largest = tf.Variable(zeros, trainable=False, name="scaled_grad_largest")
            self.histogram = tf.Variable(tf.zeros([len(variables), LOG2_BINS]),
                                         trainable=False, name="scaled_grad_log2_histogram")
            self.activation = tf.Variable(tf.zeros([len(layers), 3]), trainable=False,
                                          name="activation_statistics")
            self.recorded_at = tf.Variable(tf.constant(-1, tf.int64), trainable=False,
                                           name="recorded_at")
            self.activations_at = tf.Variable(tf.constant(-1, tf.int64), trainable=False,
                                              name="activations_recorded_at")

    def due(self, step):
        return tf.equal(step % self.every, 0)

    def record(self, step, grads, scaled_grads, finite, activations):
        """Cross-replica, in the step: when `step` is due, records the activation
        statistics (`activations`: [replicas, layers, 3]) and, if finite, those of one
        replica's (reduced, so identical) gradients."""
        def compute_gradients():
            with tf.name_scope("numerics"):
                magnitudes = [tf.abs(tf.reshape(g, [-1])) for g in scaled_grads]
                self.norm.assign(tf.stack([tf.norm(g) for g in grads]))
                self.zero_fraction.assign(tf.stack(
                    [tf.reduce_mean(tf.cast(tf.equal(g, 0), tf.float32)) for g in grads]))
                self.smallest.assign(tf.stack([tf.reduce_min(
                    tf.where(m > 0, m, tf.float32.max)) for m in magnitudes]))
                self.largest.assign(tf.stack([tf.reduce_max(m) for m in magnitudes]))
                self.histogram.assign(tf.stack([_log2_histogram(m) for m in magnitudes]))
                self.recorded_at.assign(step)
            return tf.constant(True)

        def compute_activations():
            with tf.name_scope("numerics"):
                self.activation.assign(tf.concat([
                    tf.reduce_max(activations[:, :, :1], axis=0),
                    tf.reduce_mean(activations[:, :, 1:], axis=0)], axis=1))
                self.activations_at.assign(step)
            return tf.constant(True)

        tf.cond(tf.logical_and(finite, self.due(step)), compute_gradients,
                lambda: tf.constant(False))
        tf.cond(self.due(step), compute_activations, lambda: tf.constant(False))


def _log2_histogram(magnitudes):
    """Counts of the non-zero magnitudes per power of two (fixed shape: XLA/TPU-safe)."""
    bins = tf.clip_by_value(tf.cast(tf.floor(tf.math.log(magnitudes) / math.log(2.0)),
                                    tf.int32) - LOG2_LOW, 0, LOG2_BINS - 1)
    bins = tf.where(magnitudes > 0, bins, 0)
    return tf.math.unsorted_segment_sum(tf.cast(magnitudes > 0, tf.float32), bins, LOG2_BINS)
