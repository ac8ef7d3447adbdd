"""The private Keras APIs the Trainer relies on, each behind one function.

Keras has no public way to do these three things. Each function checks that
the installed Keras is a version it was written and tested for, and fails
loudly, naming the private API, on any other: a Keras upgrade then stops a run
at its start instead of changing its numbers silently.
"""

import keras

TESTED_VERSIONS = ("3.15",)  # Keras major.minor; pyproject.toml pins the same
FLATTEN_LAYERS = "_flatten_layers"
EMA_AVERAGES = "_model_variables_moving_average"
ALL_REDUCE_HOOK = "_all_reduce_sum_gradients"


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
