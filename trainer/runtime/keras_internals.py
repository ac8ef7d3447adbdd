"""The private Keras APIs the Trainer relies on, each behind one function.

Keras has no public way to do these things. Each function checks that
the installed Keras is a version it was written and tested for, and fails
loudly, naming the private API, on any other: a Keras upgrade then stops a run
at its start instead of changing its numbers silently.
"""

import collections
import contextlib

import keras

TESTED_VERSIONS = ("3.15",)  # Keras major.minor; pyproject.toml pins the same
FLATTEN_LAYERS = "_flatten_layers"
EMA_AVERAGES = "_model_variables_moving_average"
ALL_REDUCE_HOOK = "_all_reduce_sum_gradients"
NAME_COUNTERS = "object_name_uids"  # keras.src.utils.naming's global attribute


def _check(api):
    version = ".".join(keras.__version__.split(".")[:2])
    if version not in TESTED_VERSIONS:
        raise RuntimeError(
            f"Keras {keras.__version__} is not a version the Trainer was tested with "
            f"({', '.join(TESTED_VERSIONS)}), and it relies on the private Keras API {api}. "
            f"Install keras=={TESTED_VERSIONS[-1]}.* (as pyproject.toml pins), or check "
            f"{api} in this Keras and add its version to trainer/runtime/keras_internals.py.")


def sublayers(layer, recursive=True):
    """The layers inside `layer`, each after its parent, itself excluded (with
    `recursive=False`: its direct children). Keras' public `Model.layers` stops at
    the top level, and a plain Layer exposes none."""
    _check(f"Layer.{FLATTEN_LAYERS}")
    return list(getattr(layer, FLATTEN_LAYERS)(include_self=False, recursive=recursive))


def ema_averages(optimizer):
    """The EMA of the trained variables that an optimizer built with
    `use_ema=True` keeps, one per variable, or None: Keras reads them only by
    overwriting the model's weights (`finalize_variable_values`), so the
    evaluation swaps them in and out itself."""
    _check(f"Optimizer.{EMA_AVERAGES}")
    return getattr(optimizer, EMA_AVERAGES, None)


def apply_gradients_as_given(optimizer):
    """Makes `optimizer.apply` use the gradients as given, without all-reducing them.

    The Trainer all-reduces gradients itself, once, before it decides finiteness
    and clips; Keras' TensorFlow optimizer would all-reduce them a second time
    inside `apply` (in replica context), and has no public switch: the instance's
    hook is replaced.
    """
    api = ALL_REDUCE_HOOK
    _check(f"Optimizer.{api}")
    if not callable(getattr(type(optimizer), api, None)):
        raise RuntimeError(
            f"{type(optimizer).__name__} has no {api} in Keras {keras.__version__}: the "
            "gradients would be all-reduced twice. Install the Keras version pinned in "
            "pyproject.toml.")
    setattr(optimizer, api, lambda grads_and_vars: list(grads_and_vars))
    return optimizer


@contextlib.contextmanager
def fresh_name_counters():
    """Inside, Keras numbers auto-names as in a fresh process: `dense`, `variable`,
    `gru` (and a Bidirectional's `forward_gru`) rather than `dense_7`, `variable_12`.

    Keras draws every auto-name (layers, unnamed `add_weight`s, seed generators,
    copies made by wrappers) from process-wide counters, reset only by
    `keras.backend.clear_session()`, which also resets the dtype policy. After
    the block each counter is the larger of its values before and inside, so
    later names do not repeat earlier ones.
    """
    from keras.src.backend.common import global_state
    _check(f"keras.src.backend.common.global_state {NAME_COUNTERS}")
    before = global_state.get_global_attribute(NAME_COUNTERS) or {}
    fresh = collections.defaultdict(int)
    global_state.set_global_attribute(NAME_COUNTERS, fresh)
    try:
        yield
    finally:
        merged = collections.defaultdict(int, before)
        for name, count in fresh.items():
            merged[name] = max(merged[name], count)
        global_state.set_global_attribute(NAME_COUNTERS, merged)


ATTENTION_PROJECTIONS = ("_query_dense", "_key_dense", "_value_dense", "_output_dense")


def attention_projections(attention):
    """The query, key, value and output EinsumDense layers of a built
    `keras.layers.MultiHeadAttention`, for decoding with a cache of keys and values
    (keras_hub's CachedMultiHeadAttention reads the same attributes)."""
    _check(f"MultiHeadAttention.{'/'.join(ATTENTION_PROJECTIONS)}")
    return tuple(getattr(attention, name) for name in ATTENTION_PROJECTIONS)
