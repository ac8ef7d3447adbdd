"""The checkpoint layout: every variable under a stable name, compared before a restore.

Keras 3 layers held in a Python list or dict are no `tf.train.Checkpoint`
children of their model, and the optimizer's slots are saved by position. So
the layout is our own: a `model` node holding every model variable (any dtype,
however its layer is held) under its name, and an `optimizer` node holding each
slot under `<variable name>/<slot>` (e.g. `dense/kernel/momentum`) and the
optimizer's own variables (`iteration`) under theirs.

A variable's name is its Keras `variable.path` (the model is built with fresh
name counters, trainer/state/model_build.py) with auto-numbered layer names
counted within the model: `dense_7/kernel` becomes `dense/kernel` if it is the
first Dense of the model. Names are what `init.include`, `optimizer.freeze` and
`weight_decay_exclude` match and what errors report.
"""

import collections
import re

import keras
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from trainer.runtime.precision import layers_of

LAYOUT_VERSION = 2   # 1: Keras' own object graph (tftrainer 0.1); 2: this layout
SAVED_NODES = ("model", "optimizer")  # compared strictly before a restore
_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _auto_name(class_name):
    """The name Keras gives a layer of this class before numbering (its `to_snake_case`)."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", class_name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def variable_names(model):
    """{name: variable} for every variable of `model` (trainable or not, any dtype),
    in the model's order; see the module docstring for the names."""
    bases = {_auto_name(type(layer).__name__) for layer in [model, *layers_of(model)]}
    bases.add("seed_generator")  # keras.random.SeedGenerator's state
    auto = re.compile("(" + "|".join(map(re.escape, sorted(bases, key=len, reverse=True)))
                      + r")(?:_\d+)?")
    numbered = collections.defaultdict(dict)  # base -> {name in this process: in the model}

    def canonical(segment):
        match = auto.fullmatch(segment)
        if not match:
            return segment
        seen = numbered[match.group(1)]
        if segment not in seen:
            seen[segment] = match.group(1) + (f"_{len(seen)}" if seen else "")
        return seen[segment]

    names = {}
    for variable in model.variables:
        name = "/".join(canonical(s) for s in variable.path.split("/"))
        if name in names:
            raise ValueError(
                f"Two variables of the model are both named {name!r} ({variable.path}): give "
                "their layers distinct names (name=...), so a checkpoint can tell them apart.")
        names[name] = variable
    _check_nothing_unlisted(model)
    return names


def _check_nothing_unlisted(model):
    """Fails on raw `tf.Variable`s held by the model's layers: Keras 3 does not list them
    in `model.variables`, so no checkpoint would hold them."""
    unlisted = [v.name for v in tf.train.TrackableView(model).descendants()
                if isinstance(v, tf.Variable)]
    if unlisted:
        raise ValueError(
            f"The model holds {len(unlisted)} tf.Variable(s) that Keras does not list in "
            f"model.variables ({', '.join(unlisted[:5])}), so checkpoints would not hold "
            "them. Create them with the layer's self.add_weight(...) instead.")


def matching(names, patterns, what, required=True):
    """The names that fully match any regex of `patterns`; with `required`, a pattern
    matching none is an error naming `what` (the config field) and some names."""
    patterns = tuple(patterns or ())
    for pattern in patterns if required else ():
        if not any(re.fullmatch(pattern, name) for name in names):
            some = list(names)[:: max(1, len(names) // 8)][:8]
            raise ValueError(f"{what}: {pattern!r} matches no variable (a pattern must match "
                             f"a whole name, '.*head.*' for 'head' anywhere). Some names: "
                             f"{', '.join(some)}.")
    return [n for n in names if any(re.fullmatch(p, n) for p in patterns)]


def optimizer_variables(optimizer, trained):
    """{name: variable} of a built Keras optimizer: its slots as `<variable>/<slot>`,
    `trained` being {name: variable} as passed to `optimizer.build`.

    Keras names a slot `<variable path with / as _>_<slot>` (add_variable_from_reference);
    a slot is matched to the variable with the longest such prefix.
    """
    prefixes = sorted(((v.path.replace("/", "_") + "_", n) for n, v in trained.items()),
                      key=lambda p: -len(p[0]))
    names = {}
    for variable in optimizer.variables:
        owner = next(((p, n) for p, n in prefixes if variable.name.startswith(p)), None)
        name = f"{owner[1]}/{variable.name[len(owner[0]):]}" if owner else variable.name
        if name in names:
            raise RuntimeError(f"Optimizer variables {variable.path} and "
                               f"{names[name].path} both map to {name!r}: this Keras "
                               "changed how it names optimizer slots.")
        names[name] = variable
    return names



def node(variables):
    """A checkpoint node with each of {name: variable} as a child of that name.

    A Keras variable is saved through the backend `tf.Variable` it wraps: the same
    tensors under the same names, but Keras 3's own `_copy_trackable_to_cpu`
    creates a new tf.Variable at every call, which an asynchronous save (a
    tf.function, once per save) refuses after the first.
    """
    return tf.train.Checkpoint(**{name: v.value if isinstance(v, keras.Variable) else v
                                  for name, v in variables.items()})


def layout_variable():
    """The layout version, saved with every checkpoint (identical on every replica)."""
    return tf.Variable(LAYOUT_VERSION, dtype=tf.int64, trainable=False, name="layout",
                       synchronization=tf.VariableSynchronization.ON_WRITE,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def checkpoint_reader(path):
    """A reader of checkpoint `path` (a prefix). Not `tf.train.load_checkpoint`, which
    takes a prefix on ram:// (any prefix of a file is a directory there) for a directory."""
    return tf.compat.v1.train.NewCheckpointReader(path)


def saved_variables(path):
    """{node: {name: (checkpoint key, shape, dtype)}} of the checkpoint at `path`, for its
    top-level nodes that hold named variables, and its layout version (1 if none)."""
    reader = checkpoint_reader(path)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_GRAPH_KEY))

    def value_key(node_id):
        keys = [a.checkpoint_key for a in graph.nodes[node_id].attributes
                if a.name == "VARIABLE_VALUE"]
        return keys[0] if keys else None

    nodes, version = {}, 1
    for child in graph.nodes[0].children:
        if child.local_name == "layout":
            version = int(reader.get_tensor(value_key(child.node_id)))
        elif child.local_name in SAVED_NODES:
            nodes[child.local_name] = {
                c.local_name: (key, tuple(shapes[key]), tf.as_dtype(dtypes[key]))
                for c in graph.nodes[child.node_id].children
                for key in [value_key(c.node_id)] if key}
    return nodes, version


def differences(expected, saved):
    """(missing, unexpected, mismatched) between {name: variable} and a saved node's
    {name: (key, shape, dtype)}: lists of "name shape" lines."""
    def describe(shape, dtype):
        return f"{list(shape)} {tf.as_dtype(dtype).name}"

    missing = [f"{n} {describe(v.shape, v.dtype)}" for n, v in expected.items()
               if n not in saved]
    unexpected = [f"{n} {describe(s, d)}" for n, (_, s, d) in saved.items()
                  if n not in expected]
    mismatched = [f"{n}: checkpoint {describe(s, d)}, this run {describe(v.shape, v.dtype)}"
                  for n, v in expected.items() if n in saved
                  for _, s, d in [saved[n]]
                  if tuple(s) != tuple(v.shape) or tf.as_dtype(d) != tf.as_dtype(v.dtype)]
    return missing, unexpected, mismatched
