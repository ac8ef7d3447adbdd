"""`workdir/checkpoints`: restore the newest readable checkpoint, save, keep the newest N.

Two kinds of restore failure are told apart, because they call for opposite
actions: a checkpoint whose files cannot be read (truncated, corrupt) is
skipped for the one before it, while a readable checkpoint that does not fit
this run's model or optimizer (another width, another optimizer) stops the run
with what differs: falling back would silently train something else.
"""

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

    @property
    def latest(self):
        return tf.train.latest_checkpoint(self.directory)

    def save(self):
        self.manager.save(checkpoint_number=self.step)
        if not self.is_chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)

    def restore(self):
        """Restores the newest readable checkpoint; returns its path, or None if there is none.

        Nothing is ever deleted. Raises IncompatibleCheckpointError for a
        checkpoint that reads fine but does not fit, RuntimeError when no
        checkpoint can be read.
        """
        state = tf.train.get_checkpoint_state(self.directory)
        paths = list(state.all_model_checkpoint_paths) if state else []
        for path in reversed(paths):
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
                logging.warning("Checkpoint %s is unreadable (%s) Trying the previous one.",
                                path, damage)
                continue
            logging.info("Restored %s (step %d).", path, int(self.step.numpy()))
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
