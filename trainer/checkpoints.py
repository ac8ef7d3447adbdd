"""`workdir/checkpoints`: restore the newest readable checkpoint, save, keep the newest N.

Two kinds of restore failure are told apart, because they call for opposite
actions: a checkpoint whose files cannot be read (truncated, corrupt) is
skipped for the one before it, while a readable checkpoint that does not fit
this run's model or optimizer (another width, another optimizer) stops the run
with what differs: falling back would silently train something else.
"""

import os
import shutil
import tempfile

import tensorflow as tf
from absl import logging


class IncompatibleCheckpointError(ValueError):
    """A readable checkpoint that does not fit the model or optimizer of this run."""


class Checkpoints:
    """A `tf.train.CheckpointManager` of `checkpoint` in `directory`, numbered by `step`.

    Every worker must call `save` (a save holds collectives); only the chief
    writes `directory`, the others write to a temporary directory that is
    removed at once.
    """

    def __init__(self, checkpoint, directory, step, max_to_keep, is_chief):
        self.checkpoint, self.directory, self.step, self.is_chief = (
            checkpoint, directory, step, is_chief)
        self.manager = tf.train.CheckpointManager(
            checkpoint, directory if is_chief else tempfile.mkdtemp(),
            max_to_keep=max_to_keep, step_counter=step)
        self.saved_step = None  # the step of the newest checkpoint restored or saved

    @property
    def latest(self):
        return tf.train.latest_checkpoint(self.directory)

    def save(self):
        """Saves at the current step, unless the newest checkpoint is already of it."""
        step = int(self.step.numpy())
        if step != self.saved_step:
            self.manager.save(checkpoint_number=self.step)
            self.saved_step = step
            if not self.is_chief:
                shutil.rmtree(self.manager.directory, ignore_errors=True)

    def write(self, prefix):
        """Writes the state to `prefix` outside the rotation (e.g. the best checkpoint);
        every worker must call it, only the chief's files are kept."""
        if self.is_chief:
            return self.checkpoint.write(prefix)
        scratch = tempfile.mkdtemp()
        self.checkpoint.write(os.path.join(scratch, "ckpt"))
        shutil.rmtree(scratch, ignore_errors=True)
        return prefix

    def restore(self, path=None):
        """Restores checkpoint `path`, or else the newest readable one; returns its path,
        or None if there is none.

        Nothing is ever deleted. Raises IncompatibleCheckpointError for a
        checkpoint that reads fine but does not fit, RuntimeError when no
        checkpoint can be read.
        """
        if path:
            paths = [path]
        else:
            state = tf.train.get_checkpoint_state(self.directory)
            paths = list(state.all_model_checkpoint_paths) if state else []
        for remaining, path in reversed(list(enumerate(paths))):
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except Exception as e:  # noqa: BLE001  (OpError, IndexError, ValueError... by damage)
                damage = read_error(path)
                if damage is None:
                    raise IncompatibleCheckpointError(
                        f"Checkpoint {path} does not fit this run: {_first_line(e, 400)} It "
                        "was written by a run with another model or optimizer config; the "
                        "config of the run that wrote the workdir is in its config.json. "
                        "Relaunch with that config to continue it, or use a new --workdir "
                        "to start from scratch. Nothing was changed.") from e
                logging.warning("Checkpoint %s is unreadable (%s)%s", path, damage,
                                " Trying the previous one." if remaining else "")
                continue
            self.saved_step = int(self.step.numpy())
            logging.info("Restored %s (step %d).", path, self.saved_step)
            return path
        if paths:
            raise RuntimeError(f"No readable checkpoint in {self.directory} (tried "
                               f"{', '.join(paths)}); nothing was deleted. Move the directory "
                               "away to start from scratch.")
        return None


def read_error(path):
    """Why the files of checkpoint `path` cannot be read, or None if every tensor reads."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as e:  # noqa: BLE001  (the reader raises many types on damage)
        return _first_line(e, 200)
    return None


def _first_line(error, limit):
    lines = str(error).strip().splitlines()
    line = (lines[0] if lines else "")[:limit].rstrip(".")
    return f"{type(error).__name__}: {line}."


def check_model_state_is_saved(model, ignore=()):
    """Fails on model variables outside the trainable ones that a checkpoint of the model
    would not hold: Keras 3 layers kept in a Python list (or dict) are no checkpoint
    children of the model (their trainable variables are still saved, through the
    optimizer's list), so their state, such as BatchNormalization's moving statistics,
    would be silently lost on resume. `ignore`: variables the Trainer sets itself."""
    saved = {id(obj) for obj in tf.train.TrackableView(model).descendants()}
    skipped = {id(v) for v in ignore}
    lost = [v.path for v in model.non_trainable_variables
            if id(v) not in saved and id(v) not in skipped]
    if lost:
        raise ValueError(
            f"{len(lost)} model variables would not be in the checkpoints: "
            f"{', '.join(lost[:5])}{' ...' if len(lost) > 5 else ''}. Their layers are held "
            "in a Python list or dict, which Keras 3 does not make checkpoint children of "
            "the model. Give each such layer an attribute of its own (self.block_0 = ...) "
            "or build the model with the functional API.")

