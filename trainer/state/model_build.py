"""Building the task's model the same way every time: the same variable names in
every build, and every variable created before anything reads the model.

Every part of a run that needs the model (the Trainer, a warm start from a
`.weights.h5`, the export, the precision check, the finders) builds it here.
Keras names a layer or an unnamed weight from process-wide counters, so a
second build in one process would otherwise see `dense_1/kernel` or
`linear/variable_6` where the first saw `dense/kernel` or `linear/variable_4`.
And as `model.fit` does, a model Keras builds lazily (a `Sequential` without an
`Input`, a subclassed model not called yet) is built here from the train
inputs' shapes, before the optimizer, the checkpoint, the XLA timing or the
variable roles look at its variables.
"""

import keras
import tensorflow as tf

from trainer.runtime.keras_internals import fresh_name_counters


def build_model(task):
    """`task.build_model()` with fresh name counters, built on the train inputs'
    shapes if Keras left it unbuilt. Call it under the strategy's scope."""
    with fresh_name_counters():
        model = task.build_model()
        if not isinstance(model, keras.Model):
            raise TypeError(f"{type(task).__name__}.build_model() returned "
                            f"{type(model).__name__}, not a keras.Model.")
        if not model.built or not model.variables:
            _build_on_inputs(model, task)
    return model


def _build_on_inputs(model, task):
    """Builds `model` symbolically (no step runs) on the shapes of the train features,
    as `fit` does on its first batch."""
    try:
        features, _ = task.build_inputs("train", tf.distribute.InputContext(), 0).element_spec
        model(tf.nest.map_structure(
            lambda spec: keras.Input(shape=spec.shape[1:], dtype=spec.dtype.name), features),
            training=False)
    except Exception as e:  # noqa: BLE001  (whatever the user's call raises)
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}" if str(e) \
            else type(e).__name__
        raise ValueError(
            f"{type(task).__name__}.build_model() returned an unbuilt model (Keras creates "
            "its variables on the first call), and building it on the train features' "
            f"shapes failed ({reason}). Build it in build_model(): start a Sequential with "
            "keras.Input(shape=...), or call the model once on a batch of features, e.g. "
            "model(tf.zeros([1, *shape])).") from e
    if not model.variables:
        raise ValueError(
            f"{type(task).__name__}.build_model() returned a model without variables, even "
            "after a call on the train features: there is nothing to train.")
