"""Warm start (`config.init`): a new run's weights from another run or a Keras file.

Applied once, at step 0, when the workdir has no checkpoint: a resume always
continues from its own checkpoint. Only model variables are loaded (the
optimizer starts afresh). Names are those of trainer/state/layout.py on both sides:
`rename` maps the source's names onto this model's, `include` / `exclude`
choose this model's variables to load, and with `strict` (the default) an
included variable the source lacks, or holds in another shape, stops the run
before anything is changed. What was loaded, skipped and left at its initial
value is logged as a table and written to `workdir/init.json`.
"""

import os
import re

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.io import gfile

from trainer.state.layout import (LAYOUT_VERSION, checkpoint_reader, matching, saved_variables,
                                  variable_names)
from trainer.step.step_variables import SEED_STATE_NAME

RECORD = "init.json"


def source_values(path, build_model):
    """{name: numpy value} of the model variables in `path`: a workdir, one of our
    checkpoints, a `.keras` file, or a `.weights.h5` file read into `build_model()`."""
    if path.endswith(".weights.h5"):
        model = build_model()
        model.load_weights(path)
        return _values(model)
    if path.endswith(".keras"):
        return _values(keras.saving.load_model(path, compile=False))
    if gfile.isdir(path):  # a workdir, or its checkpoints/
        directory = os.path.join(path, "checkpoints")
        latest = tf.train.latest_checkpoint(directory if gfile.isdir(directory) else path)
        if not latest:
            raise FileNotFoundError(f"init.checkpoint={path}: no checkpoint in it. Name a "
                                    "workdir, a checkpoint (.../ckpt-N), a .weights.h5 or a "
                                    ".keras file.")
        path = latest
    try:
        nodes, version = saved_variables(path)
    except Exception as e:  # noqa: BLE001  (NotFoundError, DataLossError, ...)
        raise ValueError(f"init.checkpoint={path} cannot be read ({type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0][:200]}). Name a workdir, a "
                         "checkpoint (.../ckpt-N), a .weights.h5 or a .keras file.") from e
    if version != LAYOUT_VERSION:
        return _legacy_values(path, build_model)
    reader = checkpoint_reader(path)
    return {name: reader.get_tensor(key) for name, (key, _, _) in nodes["model"].items()}


def _values(model):
    return {name: v.numpy() for name, v in variable_names(model).items()}


def _weights(variables):
    """{name: variable} but dropout seed states, which the Trainer sets at every step."""
    return {n: v for n, v in variables.items() if not n.endswith(SEED_STATE_NAME)}


def _legacy_values(path, build_model):
    """A tftrainer 0.1 checkpoint (Keras' object graph) read into `build_model()`: its
    layers held in lists were saved only through the optimizer's variable list."""
    model = build_model()
    optimizer = keras.optimizers.SGD(lambda: 0.0)  # a callable rate: no variable of its own
    optimizer.build(model.trainable_variables)  # its variable list, as 0.1 saved it
    tf.train.Checkpoint(model=model, optimizer=optimizer).read(
        path).expect_partial().assert_existing_objects_matched()  # every weight found
    return _values(model)


def warm_start(config, variables, build_model, files, workdir):
    """Loads `config.init` into `variables` ({name: variable}); returns the table's
    record, or None without `init.checkpoint`. Nothing is changed on an error."""
    init = config.get("init")
    if not init or not init.checkpoint:
        return None
    variables = _weights(variables)
    include = matching(variables, init.include, "init.include")
    excluded = set(matching(variables, init.exclude, "init.exclude"))
    values = {}
    for name, value in _weights(source_values(init.checkpoint, build_model)).items():
        for pattern, replacement in init.rename:
            name = re.sub(pattern, replacement, name)
        values[name] = value
    loaded, absent, reshaped = [], [], []
    for name in include:
        if name in excluded:
            continue
        if name not in values:
            absent.append(name)
        elif tuple(values[name].shape) != tuple(variables[name].shape):
            reshaped.append(f"{name}: source {list(values[name].shape)}, this model "
                            f"{list(variables[name].shape)}")
        else:
            loaded.append(name)
    if init.strict and (absent or reshaped):
        raise ValueError(
            f"init.checkpoint={init.checkpoint} does not hold every variable init.include "
            f"chooses: missing ({len(absent)}): {', '.join(absent[:8]) or '-'}; other shape "
            f"({len(reshaped)}): {'; '.join(reshaped[:8]) or '-'}. Exclude them "
            "(--config.init.exclude), map the source's names (--config.init.rename), or "
            "set --config.init.strict=false to leave them at their initial values. "
            "Nothing was changed.")
    for name in loaded:
        variable = variables[name]
        variable.assign(np.asarray(values[name]).astype(variable.dtype))
    record = {"checkpoint": init.checkpoint, "loaded": loaded,
              "skipped": sorted(set(values) - set(loaded)),
              "left_at_init": [n for n in variables if n not in loaded]}
    lines = [f"  {what:13s} {len(record[key]):5d}  {', '.join(record[key][:4])}"
             + (" ..." if len(record[key]) > 4 else "")
             for what, key in (("loaded", "loaded"), ("skipped", "skipped"),
                               ("left at init", "left_at_init"))]
    logging.info("Warm start from %s (variables; skipped: in the source, not loaded):\n%s",
                 init.checkpoint, "\n".join(lines))
    files.write_json(os.path.join(workdir, RECORD), record)
    return record
