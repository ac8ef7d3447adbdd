"""SavedModel export for serving: `workdir/export/<step>/`.

The served model is a fresh build of the Task's model in float32 (or, with
`export.compute_dtype="training"`, in the training policy with its per-layer
overrides), loaded from a checkpoint: latest, best, or `export.checkpoint`.
Keras 3's `ExportArchive` writes it (a raw `tf.saved_model.save` of a Keras 3
model loses input names and dtypes). Its `serving_default` signature takes the
raw input a client has (the Task's `serving_input`) and returns float32
`logits` and `probabilities`. `assets.extra/export.json` says what was exported.
"""

import json
import logging as std_logging
import os
import uuid

import keras
import tensorflow as tf
from absl import logging
from tensorflow.io import gfile

from trainer.loop.action import Action
from trainer.actions import best_checkpoint as best_lib
from trainer.runtime.keras_internals import sublayers
from trainer.runtime.precision import check_float32_layers
from trainer.state.checkpoints import (IncompatibleCheckpointError, check_fits, make_checkpoint,
                                       read_error)
from trainer.state.checkpoint_state import listed_checkpoints
from trainer.state.layout import optimizer_variables, saved_variables, variable_names
from trainer.state.model_build import build_model
from trainer.state.workdir import read_json
from trainer.step.ema import evaluates_ema
from trainer.step.optimizers import build_optimizer, trained_variables

COMPUTE_DTYPES = ("float32", "training")
METADATA = os.path.join("assets.extra", "export.json")
# Written last, once the export is whole in place: a rename on gs:// copies object by
# object, so a crash part-way leaves a directory with its metadata but not all its files.
COMPLETE = os.path.join("assets.extra", "COMPLETE")


def choose_checkpoint(config, workdir):
    """`export.checkpoint`, else the best checkpoint if `trainer.best_metric` has one,
    else the latest; a clear error if there is none."""
    if config.export.checkpoint:
        return config.export.checkpoint
    if config.trainer.best_metric:
        best = read_json(os.path.join(workdir, "best", "best.json"), "the best checkpoint")
        if best and best.get("checkpoint"):  # none yet: no evaluation was finite
            return best_lib.checkpoint_path(os.path.join(workdir, "best"), best)
    paths = listed_checkpoints(os.path.join(workdir, "checkpoints"))
    if not paths:
        raise FileNotFoundError(
            f"Nothing to export: no checkpoint in {workdir}/checkpoints. Train first, or "
            "name one with --config.export.checkpoint=PATH/ckpt-N.")
    for path in reversed(paths[1:]):  # the newest that reads, as a restore chooses
        damage = read_error(path)
        if damage is None:
            return path
        logging.warning("Checkpoint %s is unreadable (%s): the one before it.", path, damage)
    return paths[0]  # (unreadable too: the export names what is wrong with it)


def check_export(config, task):
    """Fails now on an export that could not be written (before a run, not after)."""
    if config.export.compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"export.compute_dtype={config.export.compute_dtype!r} must be one "
                         f"of {COMPUTE_DTYPES}.")
    return task.serving_input()  # NotImplementedError, with its advice, if the task has none


def export(config, task, workdir, checkpoint=None, layer_policies=None):
    """Writes the SavedModel of `checkpoint` (default: `choose_checkpoint`) and returns
    its directory. Nothing is written if the checkpoint cannot be read.

    `layer_policies`: the training model's per-layer dtype policies, for
    `export.compute_dtype="training"` (default: as the config builds them).
    """
    compute_dtype = config.export.compute_dtype
    spec, preprocess = check_export(config, task)
    checkpoint = checkpoint or choose_checkpoint(config, workdir)
    model, step, weights = _load(config, task, checkpoint, compute_dtype, layer_policies)
    directory = os.path.join(workdir, "export", str(step))
    flat_spec = _named(spec)  # one named signature input per tensor of a nest

    @tf.function
    def serve(*raw):
        outputs = model(preprocess(tf.nest.pack_sequence_as(spec, raw)), training=False)
        return {name: tf.cast(t, tf.float32) if t.dtype.is_floating else t
                for name, t in task.serving_outputs(outputs).items()}

    served = serve.get_concrete_function(*flat_spec).structured_outputs
    endpoints = task.serving_endpoints(model)
    metadata = {"step": step, "checkpoint": checkpoint, "weights": weights,
                "compute_dtype": compute_dtype,
                "training_precision": config.precision, "task": config.task.name,
                "inputs": {s.name: {"dtype": s.dtype.name, "shape": s.shape.as_list()}
                           for s in flat_spec},
                "outputs": {name: t.dtype.name for name, t in served.items()},
                "endpoints": ["serving_default", *endpoints],
                "settings": task.serving_settings()}
    existing = read_json(os.path.join(directory, METADATA), "an export's metadata")
    complete = gfile.exists(os.path.join(directory, COMPLETE))
    if existing == metadata and complete:
        logging.info("%s already holds this export.", directory)
        return directory
    if existing == metadata:  # this same export, cut short: written again in its place
        logging.warning("%s holds this export without its completion mark (%s): a copy "
                        "cut short, or one written before the mark existed. Writing it "
                        "again.", directory, COMPLETE)
    elif gfile.exists(directory):
        raise FileExistsError(
            f"{directory} holds another export of step {step} "
            f"({existing or f'no {METADATA}: files of another tool, or a copy cut short'}); "
            "move it away to export again.")

    archive = keras.export.ExportArchive()
    archive.track(model)
    for resource in task.serving_resources():
        archive.track(resource)
    archive.add_endpoint("serve", serve, input_signature=flat_spec)  # also serving_default
    for name, (function, signature) in endpoints.items():
        archive.add_endpoint(name, function, input_signature=signature)
    temporary = f"{directory}.tmp-{uuid.uuid4().hex[:8]}"  # no half-written export/<step>
    absl_logger = std_logging.getLogger("absl")
    level = absl_logger.level
    archive.write_out(temporary, verbose=False)
    # TensorFlow's SavedModel walk sets absl's verbosity and "restores" it as an explicit
    # WARNING where it was unset (no parsed flags: Python use, tests): put it back.
    absl_logger.setLevel(level)
    gfile.makedirs(os.path.join(temporary, os.path.dirname(METADATA)))
    with gfile.GFile(os.path.join(temporary, METADATA), "w") as f:
        f.write(json.dumps(metadata, indent=2))
    if gfile.exists(directory):
        gfile.rmtree(directory)
    gfile.rename(temporary, directory)
    with gfile.GFile(os.path.join(directory, COMPLETE), "w") as f:
        f.write(f"step {step}\n")
    logging.info("Exported step %d (%s, compute dtype %s) to %s.", step, checkpoint,
                 compute_dtype, directory)
    return directory


def _named(spec):
    """The TensorSpecs of a nest in `tf.nest.flatten` order, each named: its own name, or
    its key path in the nest (`image`, `inputs_1`); a clear error for two alike."""
    named = [tf.TensorSpec(s.shape, s.dtype, name=s.name or "_".join(map(str, path)) or "input")
             for path, s in keras.tree.flatten_with_path(spec)]
    names = [s.name for s in named]
    if len(set(names)) < len(names):
        raise ValueError(f"serving_input(): the inputs' names {names} repeat; give each "
                         "TensorSpec its own name=.")
    return named


def _load(config, task, checkpoint, compute_dtype, layer_policies):
    """A fresh model with `checkpoint`'s weights (its EMA ones with optimizer.ema_decay
    and eval.use_ema), computing in `compute_dtype`; with the step and "ema" or "raw"."""
    previous = keras.mixed_precision.global_policy()
    try:
        if compute_dtype == "float32":
            keras.mixed_precision.set_global_policy("float32")
        model = build_model(task)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    if compute_dtype == "training" and layer_policies:
        for layer, policy in zip(sublayers(model), layer_policies):
            layer.dtype_policy = policy
    elif compute_dtype == "training":
        check_float32_layers(model, tuple(config.precision_overrides.float32_layers))
    step = tf.Variable(0, dtype=tf.int64)
    # Read as the Trainer writes it (trainer/state/layout.py); the optimizer holds the EMA.
    names = variable_names(model)
    trained = trained_variables(names, config.optimizer)
    optimizer = build_optimizer(config.optimizer, int(config.trainer.train_steps), step,
                                trained)
    named = {"model": names, "optimizer": optimizer_variables(optimizer, trained)}
    try:
        check_fits(checkpoint, named, *saved_variables(checkpoint))
        make_checkpoint(named, step=step).read(checkpoint).expect_partial()
    except IncompatibleCheckpointError as e:  # its lists of what differs, whole
        raise ValueError(f"Cannot export: {e} Name a checkpoint of this config with "
                         "--config.export.checkpoint=PATH/ckpt-N; nothing was written.") from e
    except Exception as e:  # noqa: BLE001  (missing or damaged: same advice)
        damage = read_error(checkpoint)
        raise ValueError(
            f"Cannot export checkpoint {checkpoint}: "
            f"{(damage or str(e).strip().splitlines()[0][:300]).rstrip('.')}. Name a "
            "readable checkpoint "
            "of this config with --config.export.checkpoint=PATH/ckpt-N; nothing was "
            "written.") from e
    use_ema = evaluates_ema(config)
    if use_ema:
        optimizer.finalize_variable_values(list(trained.values()))  # Keras: EMA -> model
    return model, int(step.numpy()), "ema" if use_ema else "raw"


class Export(Action):
    """Exports at the end of training (`export.enabled`) what `choose_checkpoint` picks:
    `export.checkpoint`, else the best checkpoint the workdir keeps (this run's, or a
    continuous evaluator's beside a --mode=train run), else the final one; in the
    trained model's policies."""

    every, chief_only, kind = 0, True, "checkpoint"

    def __call__(self, controller, step, logs):
        trainer = controller.trainer
        trainer.checkpoints.sync()  # the final save's files are complete
        export(trainer.config, trainer.task, trainer.workdir,
               choose_checkpoint(trainer.config, trainer.workdir),
               layer_policies=[layer.dtype_policy for layer in
                               sublayers(trainer.model)])
