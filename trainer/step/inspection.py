"""One train step's forward and backward pass, layer by layer, without changing a weight:
what the divergence diagnosis (trainer/loop/diagnosis.py) reads to name the first layer
whose output or gradient went non-finite.

Keras 3 has no forward hooks, so each layer's `call` is wrapped on the instance (as the
telemetry's ActivationProbe does) to see its inputs and outputs; the tape then gives the
gradient of the loss with respect to each of them. Each call is judged on its own (a
layer called twice may break on its first call only), then the calls of a layer are
summed into its row. A layer Keras gives no path (Softmax, Dropout: they do not build)
is named by its parent's path and its own name.
"""

import contextlib
import re

import numpy as np
import tensorflow as tf

from trainer.runtime.keras_internals import sublayers
from trainer.step.evaluation import as_float32

# One row per layer; "largest" columns are the largest finite magnitude (max over calls
# and replicas), the others count entries or calls (summed). Gradients are the scaled
# ones, in the layer's compute dtype, as the step computes them. An origin is a call
# that turned finite values non-finite: its output from finite inputs (forward), or its
# input or weight gradients from a finite output gradient (backward).
COLUMNS = ("largest_output", "nonfinite_outputs", "inf_outputs", "nonfinite_inputs",
           "nonfinite_output_grads", "nonfinite_input_grads", "inf_input_grads",
           "nonfinite_weight_grads", "largest_output_grad", "largest_input_grad",
           "forward_origins", "backward_origins")
_LARGEST = np.array([c.startswith("largest") for c in COLUMNS])
_NONFINITE = np.array([c.startswith("nonfinite") for c in COLUMNS])
# The batch as a whole: non-finite entries in the features and labels, loss not finite.
BATCH_COLUMNS = ("nonfinite_features", "nonfinite_labels", "nonfinite_loss")


def named_layers(model):
    """[(path, layer, parent path or None)]: the model, then every layer inside it, each
    after its parent (Keras paths do not say nesting: a Functional model's layers have
    none of its name)."""
    named = [(model.path or model.name, model, None)]

    def visit(layer, path):
        for child in sublayers(layer, recursive=False):
            child_path = child.path or f"{path}/{child.name}"
            named.append((child_path, child, path))
            visit(child, child_path)

    visit(model, named[0][0])
    return named


def inside(path, ancestor, parents):
    """Whether layer `path` is inside layer `ancestor` (`parents`: path -> parent path)."""
    parent = parents.get(path)
    while parent is not None:
        if parent == ancestor:
            return True
        parent = parents.get(parent)
    return False


class _CallRecorder:
    """Wraps each layer's `call` to record (path, float inputs, outputs) while recording."""

    def __init__(self, named):
        self._calls = None
        for path, layer, _ in named:
            self._wrap(layer, path)

    def _wrap(self, layer, path):
        original = layer.call

        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            if self._calls is not None:
                self._calls.append((path, _floats((args, kwargs)), outputs))
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


def _count(tensors, test=lambda t: tf.logical_not(tf.math.is_finite(t))):
    counts = [tf.reduce_sum(tf.cast(test(t), tf.float32)) for t in tensors if t is not None]
    return tf.add_n(counts) if counts else tf.zeros([])


def _inf(t):
    return tf.math.is_inf(t)


def _largest(tensors):
    values = [tf.cast(tf.reduce_max(tf.where(tf.math.is_finite(t), tf.abs(t),
                                             tf.zeros_like(t))), tf.float32)
              for t in tensors if t is not None and t.shape.num_elements() != 0]
    return tf.reduce_max(tf.stack([tf.zeros([])] + values))


def combine(rows, xp=tf):
    """Rows of COLUMNS stacked on axis 0 -> one: the largest of "largest" columns, the sum
    of the others (`xp`: tf in the step, np on the host)."""
    if xp is tf:
        return tf.where(_LARGEST, tf.reduce_max(rows, axis=0), tf.reduce_sum(rows, axis=0))
    return np.where(_LARGEST, rows.max(axis=0), rows.sum(axis=0))


class StepInspection:
    """`inspect(features, labels, scale)`: each layer's COLUMNS, and the batch's, on
    `trainer`'s state at the step it is at (the same batch and dropout masks as the
    train step), with the loss scaled by `scale`. No variable changes: the forward pass's
    state (BatchNormalization's statistics) is put back. One micro-batch per call, as
    the step holds one in memory at a time."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.named = named_layers(trainer.model)
        self.layers = {path: layer for path, layer, _ in self.named}
        self.parents = {path: parent for path, _, parent in self.named}
        self._recorder = _CallRecorder(self.named)
        # Each layer's own trained variables (not its sublayers'), by index in trained.
        index = {id(v): i for i, v in enumerate(trainer.trained_variables)}
        self._own = {}
        for path, layer, _ in self.named:
            inner = {id(v) for child in sublayers(layer, recursive=False)
                     for v in child.trainable_weights}
            self._own[path] = [index[id(v)] for v in layer.trainable_weights
                               if id(v) in index and id(v) not in inner]
        self.paths = None  # the layers called, in the order their calls returned (traced)
        self._inspect = tf.function(self._cross_replica, autograph=False)

    def inspect(self, features, labels, scale):
        """-> ([layers of self.paths, COLUMNS], {BATCH_COLUMNS: count}), every replica's."""
        rows, batch = [], []
        with self._state_put_back():
            for micro in range(self.trainer.accumulation_steps):
                stats, counts = self._inspect(features, labels, tf.constant(scale, tf.float32),
                                              tf.constant(micro, tf.int64))
                rows.append(combine(stats.numpy(), np))
                batch.append(counts.numpy().sum(axis=0))
        return combine(np.stack(rows), np), dict(zip(BATCH_COLUMNS, np.sum(batch, axis=0)))

    @contextlib.contextmanager
    def _state_put_back(self):
        state = [v.numpy() for v in self.trainer.variables.state]
        try:
            yield
        finally:
            for v, value in zip(self.trainer.variables.state, state):
                v.assign(value)

    def _cross_replica(self, features, labels, scale, micro):
        strategy = self.trainer.strategy
        stats, counts = strategy.run(self._replica, args=(features, labels, scale, micro))
        # Every worker's replicas, so that the chief sees them all.
        return strategy.gather(stats, axis=0), strategy.gather(counts, axis=0)

    def _replica(self, features, labels, scale, micro):
        """One replica's micro-batch `micro`: [1, layers, COLUMNS], [1, BATCH_COLUMNS]."""
        trainer = self.trainer
        steps = trainer.accumulation_steps
        if steps > 1:
            features, labels = tf.nest.map_structure(lambda t: tf.gather(t, micro),
                                                     (features, labels))
        trainer._reseed(trainer.step * steps + micro)
        with tf.GradientTape() as tape:
            with self._recorder.recording() as calls:
                outputs = as_float32(trainer.model(features, training=True))
            scaled = trainer.step_loss(labels, outputs) * scale
        inputs = [i for _, i, _ in calls]
        outs = [_floats(out) for _, _, out in calls]
        targets = [t for group in inputs + outs for t in group] + trainer.trained_variables
        grads = iter(tape.gradient(scaled, targets))
        input_grads = [[next(grads) for _ in group] for group in inputs]
        output_grads = [[next(grads) for _ in group] for group in outs]
        var_grads = list(grads)
        if self.paths is None:
            self.paths = list(dict.fromkeys(path for path, _, _ in calls))
        per_layer, weighed = {path: [] for path in self.paths}, set()
        for (path, _, _), i, o, gi, go in zip(calls, inputs, outs, input_grads, output_grads):
            # A layer's weight gradient is the sum over its calls: counted once.
            own = [] if path in weighed else [var_grads[k] for k in self._own[path]]
            weighed.add(path)
            bad_out, bad_in, bad_go = _count(o), _count(i), _count(go)
            bad_gi, bad_w = _count(gi), _count(own)
            per_layer[path].append(tf.stack([
                _largest(o), bad_out, _count(o, _inf), bad_in, bad_go, bad_gi,
                _count(gi, _inf), bad_w, _largest(go), _largest(gi),
                tf.cast((bad_out > 0) & (bad_in == 0), tf.float32),
                tf.cast((bad_go == 0) & ((bad_gi > 0) | (bad_w > 0)), tf.float32)]))
        stats = tf.stack([combine(tf.stack(rows)) for rows in per_layer.values()])
        batch = tf.stack([_count(_floats(features)), _count(_floats(labels)),
                          _count([scaled])])
        return stats[tf.newaxis], batch[tf.newaxis]

    def finite_in_float32(self, path, features, labels, scale):
        """Whether this step's pass is finite with layer `path` and its sublayers
        computing in float32 (what precision_overrides.float32_layers would do); their
        policies are put back after."""
        changed = [(layer, layer.dtype_policy) for p, layer, _ in self.named
                   if p == path or inside(p, path, self.parents)]
        for layer, _ in changed:
            layer.dtype_policy = "float32"
        try:
            with self._state_put_back():
                fresh = tf.function(self._cross_replica, autograph=False)  # a new trace
                for micro in range(self.trainer.accumulation_steps):
                    stats, batch = fresh(features, labels, tf.constant(scale, tf.float32),
                                         tf.constant(micro, tf.int64))
                    if np.sum(batch.numpy()) or combine(stats.numpy(), np)[:, _NONFINITE].any():
                        return False
            return True
        finally:
            for layer, policy in changed:
                layer.dtype_policy = policy

    def first_nonfinite_op(self, features, labels, scale):
        """The first op TensorFlow's check_numerics sees produce inf/NaN in this step's
        forward or backward pass, on this worker's replicas: {"op", "node", "created_at"}
        (the innermost frame outside TensorFlow and Keras), or None. Call it only where
        the forward pass holds no collective (a worker's error would leave its peers
        waiting)."""
        strategy = self.trainer.strategy
        replica_pass = tf.function(
            lambda f, l, s, m: strategy.run(self._replica, args=(f, l, s, m)),
            autograph=False)
        tf.debugging.enable_check_numerics()
        try:  # a new trace, instrumented
            with self._state_put_back():
                for micro in range(self.trainer.accumulation_steps):
                    replica_pass(features, labels, tf.constant(scale, tf.float32),
                                 tf.constant(micro, tf.int64))
            return None
        except tf.errors.InvalidArgumentError as error:
            return _parse_check_numerics(error.message)
        finally:
            tf.debugging.disable_check_numerics()


# Frames of TensorFlow, Keras and this framework's step (TensorFlow cuts long paths to
# their end: "...as/src/layers/normalization/...").
_LIBRARIES = re.compile(r"site-packages|dist-packages|tensorflow/python/|"
                        r"/src/(layers|ops|models|backend|utils|trainers)/|trainer/step/")


def _parse_check_numerics(message):
    op = re.search(r'graph op "([^"]+)"', message)
    node = re.search(r"\{\{node ([^}]+?)(?:/CheckNumerics\w*)?\}\}", message)
    frames = re.findall(r"\+ (\S+) \(L(\d+)\) (\S+)", message)
    user = [f"{path} line {line} ({fn})" for path, line, fn in frames
            if not _LIBRARIES.search(path)]
    return {"op": op.group(1) if op else None, "node": node.group(1) if node else None,
            "created_at": user[-1] if user else None}
