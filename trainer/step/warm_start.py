"""Warm start (`config.init`): a new run's weights from another run or a Keras file.

Applied once, at step 0, when the workdir has no checkpoint: a resume always
continues from its own checkpoint. Only model variables are loaded (the
optimizer starts afresh). From a workdir, its newest readable checkpoint (a
damaged one falls back to the one before, as a restore does); from a run that
keeps an EMA of its weights, the averages (`init.use_ema`), since those are
what it evaluated, kept as best and exported. Names are those of trainer/state/layout.py on both sides:
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

from trainer.state.checkpoint_state import listed_checkpoints
from trainer.state.checkpoints import read_error
from trainer.state.workdir import read_json
from trainer.state.layout import (LAYOUT_VERSION, checkpoint_reader, matching, saved_variables,
                                  variable_names)
from trainer.step.step_variables import SEED_STATE_NAME

RECORD = "init.json"
TASK_RECORD = "task.json"  # a run's Task.run_record (trainer/loop/run_summary.py)
EMA_SLOT = "/average"  # Keras' EMA of a weight, as the checkpoint layout names its slot


def source_values(path, build_model, use_ema=True, keras_architecture=False):
    """({name: numpy value} of the model variables in `path`, which weights they are):
    `path` is a workdir (its newest readable checkpoint), one of our checkpoints, or a
    `.weights.h5` or `.keras` file read into `build_model()`. With `use_ema`, a
    checkpoint that keeps an EMA of the weights gives its averages.

    A `.keras` file's architecture (its config.json) can name code to import, so
    only its weights are read, unless `keras_architecture` (init.keras_architecture:
    a file the user trusts) builds its own model."""
    if path.endswith(".keras") and keras_architecture:
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
        return _values(model), "the file's weights (its own architecture)"
    if path.endswith((".weights.h5", ".keras")):
        model = build_model()
        try:
            model.load_weights(path)  # (of a .keras file, Keras reads model.weights.h5 only)
        except ValueError as e:
            raise ValueError(
                f"init.checkpoint={path}: its weights do not fit this task's model "
                f"({str(e).strip().splitlines()[0][:300]}). A .weights.h5 or .keras file is "
                "read into this task's model; its own architecture is never built (it can "
                "name code to run). For the weights of another architecture set "
                "--config.init.keras_architecture=true (a .keras file you trust) with "
                "init.rename, or start from a run's checkpoint.") from e
        return _values(model), "the file's weights"
    if not gfile.isdir(path):  # one checkpoint, named
        return _checkpoint_values(path, build_model, use_ema)
    directory = os.path.join(path, "checkpoints")  # a workdir, or its checkpoints/
    directory = directory if gfile.isdir(directory) else path
    paths = listed_checkpoints(directory)
    if not paths:
        raise FileNotFoundError(f"init.checkpoint={path}: no checkpoint in it. Name a "
                                "workdir, a checkpoint (.../ckpt-N), a .weights.h5 or a "
                                ".keras file.")
    for remaining, candidate in reversed(list(enumerate(paths))):
        try:
            return _checkpoint_values(candidate, build_model, use_ema)
        except Exception as e:  # noqa: BLE001  (damaged files: the one before, as restore)
            damage = read_error(candidate)
            if damage is None:
                raise
            logging.warning("init.checkpoint: %s is unreadable (%s)%s", candidate, damage,
                            " Trying the previous one." if remaining else "")
            error = e
    raise ValueError(f"init.checkpoint={path}: no readable checkpoint in {directory} (tried "
                     f"{', '.join(paths)}).") from error


def _checkpoint_values(path, build_model, use_ema):
    """Values and kind of one checkpoint: see `source_values`."""
    try:
        nodes, version = saved_variables(path)
    except Exception as e:  # noqa: BLE001  (NotFoundError, DataLossError, ...)
        raise ValueError(f"init.checkpoint={path} cannot be read ({type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0][:200]}). Name a workdir, a "
                         "checkpoint (.../ckpt-N), a .weights.h5 or a .keras file.") from e
    if version != LAYOUT_VERSION:
        return _legacy_values(path, build_model), "raw weights (a tftrainer 0.1 checkpoint)"
    reader = checkpoint_reader(path)
    values = {name: reader.get_tensor(key) for name, (key, _, _) in nodes["model"].items()}
    averages = {name[:-len(EMA_SLOT)]: key for name, (key, _, _) in nodes["optimizer"].items()
                if name.endswith(EMA_SLOT)}
    if not averages:
        return values, "raw weights (the source keeps no EMA)"
    if not use_ema:
        return values, "raw weights (init.use_ema=False; the source's EMA not used)"
    values.update({name: reader.get_tensor(key) for name, key in averages.items()})
    return values, ("the EMA of the weights (what the source evaluated, kept as best and "
                    "exported; init.use_ema=False for its raw weights)")


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


def _model_names(source, variables):
    """(source prefix, this model's) when every name of each side starts with one model
    name and the two differ (`lm/` and `classifier/`), else None."""
    def model_name(names):
        first = {n.split("/", 1)[0] for n in names}
        return f"{first.pop()}/" if len(first) == 1 and all("/" in n for n in names) else None
    theirs, ours = model_name(source), model_name(variables)
    return (theirs, ours) if theirs and ours and theirs != ours else None


def source_workdir(checkpoint):
    """The workdir of the run `checkpoint` (a workdir, its checkpoints/ or a ckpt-N in
    it) names, or None (a Keras file)."""
    if not checkpoint or checkpoint.endswith((".h5", ".keras")):
        return None
    path = os.path.expanduser(checkpoint).rstrip("/")  # local, or gs://...
    if not gfile.isdir(path):  # workdir/checkpoints/ckpt-N
        return os.path.dirname(os.path.dirname(path))
    return os.path.dirname(path) if os.path.basename(path) == "checkpoints" else path


def _differing_record(checkpoint, task_record):
    """The keys in which the source run's task.json (Task.run_record: a classifier's
    label names) differs from this run's, or []."""
    workdir = source_workdir(checkpoint)
    source = read_json(os.path.join(workdir, TASK_RECORD),
                       "the init run's task record") if workdir and task_record else None
    if not source:
        return []
    return sorted(k for k in set(source) | set(task_record) if source.get(k) != task_record.get(k))


def warm_start(config, variables, build_model, files, workdir, task_record=None):
    """Loads `config.init` into `variables` ({name: variable}); returns the table's
    record, or None without `init.checkpoint`. Nothing is changed on an error.
    `task_record`: this run's Task.run_record; a source run whose own differs (a
    classifier of other labels) gives none of the `init.new` variables (its head)."""
    init = config.init
    if not init.checkpoint:
        return None
    variables = _weights(variables)
    include = matching(variables, init.include, "init.include")
    excluded = set(matching(variables, init.exclude, "init.exclude"))
    values = {}
    source, kind = source_values(init.checkpoint, build_model, init.use_ema,
                                 init.keras_architecture)
    source = _weights(source)
    renamed_model = None if init.rename else _model_names(source, variables)
    for name, value in source.items():
        for pattern, replacement in init.rename:
            name = re.sub(pattern, replacement, name)
        if renamed_model:
            name = renamed_model[1] + name[len(renamed_model[0]):]
        values[name] = value
    fresh = set(matching(variables, init.new, "init.new"))
    differing = _differing_record(init.checkpoint, task_record)
    loaded, absent, reshaped, new = [], [], [], []
    for name in include:
        if name in excluded:
            continue
        fits = name in values and tuple(values[name].shape) == tuple(variables[name].shape)
        if fits and not (differing and name in fresh):
            loaded.append(name)
        elif name in fresh:
            new.append(name)
        elif name not in values:
            absent.append(name)
        else:
            reshaped.append(f"{name}: source {list(values[name].shape)}, this model "
                            f"{list(variables[name].shape)}")
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
    if differing and fresh:
        kind += (f"; its {', '.join(differing)} differ from this run's (task.json), so "
                 "init.new's variables start fresh")
    if renamed_model:
        kind += f"; the source's {renamed_model[0]}... read as this model's {renamed_model[1]}..."
    record = {"checkpoint": init.checkpoint, "weights": kind, "loaded": loaded,
              "skipped": sorted(set(values) - set(loaded)),
              "left_at_init": [n for n in variables if n not in loaded]}
    lines = [f"  {what:13s} {len(record[key]):5d}  {', '.join(record[key][:4])}"
             + (" ..." if len(record[key]) > 4 else "")
             for what, key in (("loaded", "loaded"), ("skipped", "skipped"),
                               ("left at init", "left_at_init"))]
    logging.info("Warm start from %s, %s (variables; skipped: in the source, not "
                 "loaded):\n%s", init.checkpoint, kind, "\n".join(lines))
    files.write_json(os.path.join(workdir, RECORD), record)
    return record
