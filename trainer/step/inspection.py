"""One train step's forward and backward pass, layer by layer, without changing a weight:
what the divergence diagnosis (trainer/loop/diagnosis.py) reads to name the first layer
whose output or gradient went non-finite.

Keras 3 has no forward hooks, so each layer's `call` is wrapped on the instance (as the
telemetry's ActivationProbe does) to see its inputs and outputs; the tape then gives the
gradient of the loss with respect to each of them. A layer Keras gives no path
(Softmax, Dropout: they do not build) is named by its parent's path and its own name.
"""

import contextlib
import re

import numpy as np
import tensorflow as tf

from trainer.runtime.keras_internals import sublayers
from trainer.step.evaluation import as_float32

# One row per layer; "largest" columns are the largest finite magnitude (max over
# replicas), "nonfinite" ones count inf/NaN entries (summed over replicas). Gradients are
# the scaled ones, in the layer's compute dtype, as the step computes them.
COLUMNS = ("largest_output", "nonfinite_outputs", "nonfinite_inputs",
           "nonfinite_output_grads", "nonfinite_input_grads", "nonfinite_weight_grads",
           "largest_output_grad", "largest_input_grad")


def named_layers(model):
    """[(path, layer)]: the model, then every layer inside it, each after its parent."""
    named = [(model.path or model.name, model)]

    def visit(layer, path):
        for child in sublayers(layer, recursive=False):
            child_path = child.path or f"{path}/{child.name}"
            named.append((child_path, child))
            visit(child, child_path)

    visit(model, named[0][0])
    return named


class _CallRecorder:
    """Wraps each layer's `call` to record (path, inputs, outputs) while `recording()`."""

    def __init__(self, named):
        self._calls = None
        for path, layer in named:
            self._wrap(layer, path)

    def _wrap(self, layer, path):
        original = layer.call

        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            if self._calls is not None:
                self._calls.append((path, args[:1], outputs))
            return outputs

        object.__setattr__(layer, "call", call)  # (not a tracked attribute)

    @contextlib.contextmanager
    def recording(self):
        self._calls = []
        try:
            yield self._calls
        finally:
            self._calls = None


def _floats(structure):
    return [t for t in tf.nest.flatten(structure)
            if isinstance(t, tf.Tensor) and t.dtype.is_floating]


def _nonfinite(tensors):
    counts = [tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(t)), tf.float32))
              for t in tensors if t is not None]
    return tf.add_n(counts) if counts else tf.zeros([])


def _largest(tensors):
    values = [tf.reshape(tf.cast(tf.where(tf.math.is_finite(t), tf.abs(t), tf.zeros_like(t)),
                                 tf.float32), [-1]) for t in tensors if t is not None]
    return tf.reduce_max(tf.concat([tf.zeros([1])] + values, axis=0))


def combine(rows, xp=tf):
    """Rows of COLUMNS stacked on axis 0 -> one row set: the largest of "largest" columns,
    the sum of counts (`xp`: tf in the step, np on the host)."""
    largest = xp.reduce_max(rows, axis=0) if xp is tf else rows.max(axis=0)
    counts = xp.reduce_sum(rows, axis=0) if xp is tf else rows.sum(axis=0)
    mask = np.array([c.startswith("largest") for c in COLUMNS])
    return xp.where(mask, largest, counts)


class StepInspection:
    """`inspect(features, labels, scale)`: each layer's COLUMNS on `trainer`'s state at the
    step it is at (the same batch and dropout masks as the train step), with the loss
    scaled by `scale`. No variable changes: the forward pass's state (BatchNormalization's
    statistics) is put back."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.named = named_layers(trainer.model)
        self.layers = dict(self.named)
        self._recorder = _CallRecorder(self.named)
        # Each layer's own trained variables (not its sublayers'), by index in trained.
        index = {id(v): i for i, v in enumerate(trainer.trained_variables)}
        self._own = {}
        for path, layer in self.named:
            inner = {id(v) for child in sublayers(layer, recursive=False)
                     for v in child.trainable_weights}
            self._own[path] = [index[id(v)] for v in layer.trainable_weights
                               if id(v) in index and id(v) not in inner]
        self.paths = None  # the layers called, in the order their calls returned (traced)
        self._inspect = tf.function(self._cross_replica, autograph=False)

    def inspect(self, features, labels, scale):
        """-> ([layers of self.paths, COLUMNS] over every replica, whether the loss was
        finite everywhere)."""
        with self._state_put_back():
            stats, loss_finite = self._inspect(features, labels,
                                               tf.constant(scale, tf.float32))
        return combine(stats.numpy(), np), bool(loss_finite.numpy().min() == 1.0)

    @contextlib.contextmanager
    def _state_put_back(self):
        state = [v.numpy() for v in self.trainer.variables.state]
        try:
            yield
        finally:
            for v, value in zip(self.trainer.variables.state, state):
                v.assign(value)

    def _cross_replica(self, features, labels, scale):
        strategy = self.trainer.strategy
        stats, loss_finite = strategy.run(self._replica, args=(features, labels, scale))
        # Every worker's replicas, so that the chief sees them all.
        return strategy.gather(stats, axis=0), strategy.gather(loss_finite, axis=0)

    def _replica(self, features, labels, scale):
        """One replica's pass over its micro-batches: [1, layers, COLUMNS], [1]."""
        trainer = self.trainer
        steps = trainer.accumulation_steps
        rows, loss_finite = [], []
        for micro in range(steps):
            batch = (features, labels) if steps == 1 else tf.nest.map_structure(
                lambda t: t[micro], (features, labels))
            trainer._reseed(trainer.step * steps + micro)
            row, finite = self._micro_batch(*batch, scale)
            rows.append(row)
            loss_finite.append(finite)
        # (float: gather takes no bools)
        return (combine(tf.stack(rows))[tf.newaxis],
                tf.cast(tf.reduce_all(tf.stack(loss_finite)), tf.float32)[tf.newaxis])

    def _micro_batch(self, features, labels, scale):
        trainer = self.trainer
        with tf.GradientTape() as tape:
            with self._recorder.recording() as calls:
                outputs = as_float32(trainer.model(features, training=True))
            scaled = trainer.step_loss(labels, outputs) * scale
        inputs = [_floats(args) for _, args, _ in calls]
        outs = [_floats(out) for _, _, out in calls]
        targets = [t for group in inputs + outs for t in group] + trainer.trained_variables
        grads = iter(tape.gradient(scaled, targets))
        input_grads = [[next(grads) for _ in group] for group in inputs]
        output_grads = [[next(grads) for _ in group] for group in outs]
        var_grads = list(grads)
        if self.paths is None:
            self.paths = list(dict.fromkeys(path for path, _, _ in calls))
        per_layer = {path: [] for path in self.paths}
        for (path, _, _), i, o, gi, go in zip(calls, inputs, outs, input_grads, output_grads):
            own = [var_grads[k] for k in self._own[path]]
            per_layer[path].append(tf.stack([
                _largest(o), _nonfinite(o), _nonfinite(i), _nonfinite(go), _nonfinite(gi),
                _nonfinite(own), _largest(go), _largest(gi)]))
        return (tf.stack([combine(tf.stack(rows)) for rows in per_layer.values()]),
                tf.math.is_finite(scaled))

    def first_nonfinite_op(self, features, labels, scale):
        """The first op TensorFlow's check_numerics sees produce inf/NaN in this step's
        forward or backward pass, on this worker's replicas: {"op", "node", "created_at"}
        (the innermost frame outside TensorFlow and Keras), or None."""
        strategy = self.trainer.strategy
        tf.debugging.enable_check_numerics()
        try:  # a new trace, instrumented; no collective, so a worker's error stops only it
            with self._state_put_back():
                tf.function(lambda f, l, s: strategy.run(self._replica, args=(f, l, s)),
                            autograph=False)(features, labels, tf.constant(scale, tf.float32))
            return None
        except tf.errors.InvalidArgumentError as error:
            return _parse_check_numerics(error.message)
        finally:
            tf.debugging.disable_check_numerics()


_LIBRARIES = re.compile(r"site-packages|dist-packages|tensorflow/python/|keras/src/|trainer/step/")


def _parse_check_numerics(message):
    op = re.search(r'graph op "([^"]+)"', message)
    node = re.search(r"\{\{node ([^}]+?)(?:/CheckNumerics\w*)?\}\}", message)
    frames = re.findall(r"\+ (\S+) \(L(\d+)\) (\S+)", message)
    user = [f"{path} line {line} ({fn})" for path, line, fn in frames
            if not _LIBRARIES.search(path)]
    return {"op": op.group(1) if op else None, "node": node.group(1) if node else None,
            "created_at": user[-1] if user else None}
