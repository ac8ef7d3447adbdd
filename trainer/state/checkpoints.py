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
import weakref

import tensorflow as tf
from absl import logging

from trainer.runtime.settings import on_off_auto
from trainer.state.checkpoint_state import (found_on_disk, latest_checkpoint, listed_checkpoints,
                                            number, repair_state)
from trainer.state.layout import (LAYOUT_VERSION, SAVED_NODES, checkpoint_reader, differences,
                                  layout_variable, node, saved_variables)


class IncompatibleCheckpointError(ValueError):
    """A readable checkpoint that does not fit the model or optimizer of this run."""


def make_checkpoint(named, **others):
    """The `tf.train.Checkpoint` of `named` ({"model": {name: variable}, "optimizer":
    {...}}, see trainer/state/layout.py), the layout version and `others` (trackables)."""
    return tf.train.Checkpoint(**{n: node(named[n]) for n in SAVED_NODES},
                               layout=layout_variable(), **others)


_LIVE = weakref.WeakSet()  # every Checkpoints of this process, for `sync`


class Checkpoints:
    """A `tf.train.CheckpointManager` in `directory`, numbered by `step`, of the variables
    `named` ({"model": {name: variable}, "optimizer": {...}}) and `others`.

    Every worker must call `save` (a save holds collectives); only the chief
    writes `directory`, the others write to a temporary directory that is
    removed at once.

    With `async_save`, `save` blocks only while the values are copied to host
    memory; a thread writes the files, and the manager names the checkpoint in
    `directory/checkpoint` (where restores and the continuous evaluator look)
    only once they are complete. `sync()` waits for that: call it before
    reading the files in this process (`restore` does).
    """

    def __init__(self, named, others, directory, step, max_to_keep, is_chief,
                 async_save=False):
        self.named, self.directory, self.step, self.is_chief = (
            named, directory, step, is_chief)
        self.checkpoint = make_checkpoint(named, **others)
        self.max_to_keep = max_to_keep
        self._manager = None  # built at the first save, after `prepare_for_writes`
        self._before = None  # the numbers on disk before this process saved (`_check_new_number`)
        self.options = tf.train.CheckpointOptions(enable_async=async_save)
        self.saved_step = None  # the step of the newest checkpoint restored or saved
        self._writing = None  # the prefix of a save whose files may not be complete yet
        _LIVE.add(self)

    @property
    def manager(self):
        """The `tf.train.CheckpointManager`, built at the first use: it reads the state file
        once, when built, so that must come after `prepare_for_writes` repaired it."""
        if self._manager is None:
            self._manager = tf.train.CheckpointManager(
                self.checkpoint, self.directory if self.is_chief else tempfile.mkdtemp(),
                max_to_keep=self.max_to_keep, step_counter=self.step)
        return self._manager

    @property
    def latest(self):
        """The newest checkpoint, once this process's saves are complete."""
        self.sync()
        return latest_checkpoint(self.directory)

    def save(self):
        """Saves at the current step, unless the newest checkpoint is already of it.
        Refuses to write over a readable checkpoint of the same number."""
        step = int(self.step.numpy())
        if step != self.saved_step:
            self._check_new_number(step)
            try:
                self._writing = self.manager.save(checkpoint_number=self.step,
                                                  options=self.options)
            except Exception:  # what the failed write holds (a full disk)
                _remove(os.path.join(self.manager.directory, f"ckpt-{step}_temp"))
                raise
            self.saved_step = step
            if not self.is_chief:
                self.manager.sync()
                shutil.rmtree(self.manager.directory, ignore_errors=True)
                self._writing = None

    def _check_new_number(self, step):
        """A save of `step` where a readable ckpt-`step` was on disk before this run saved
        would replace a checkpoint this run did not restore: never (an unreadable one is
        replaced, with a warning). Every worker decides alike (a save holds collectives)
        from what was on disk before any of them saved: the restore's listing, taken on
        every worker before training, not the files the chief is writing meanwhile."""
        if self._before is None:  # (no restore: a Checkpoints used on its own)
            self._before = {number(p) for p in found_on_disk(self.directory)}
        prefix = os.path.join(self.directory, f"ckpt-{step}")
        if step not in self._before or not tf.io.gfile.exists(prefix + ".index"):
            return
        damage = read_error(prefix)
        if damage is None:
            raise RuntimeError(
                f"Refusing to save {prefix}: a readable checkpoint of that number exists, "
                "and this run did not restore it. Nothing was written. Move the workdir's "
                "checkpoints away to start from scratch, or relaunch to continue from the "
                "newest.")
        logging.warning("Replacing the unreadable checkpoint %s (%s).", prefix, damage)

    def sync(self):
        """Waits until the files of every save of this process so far are complete (of
        any Checkpoints: another Trainer on the same workdir too); raises the error of
        a failed asynchronous write."""
        for checkpoints in list(_LIVE):
            if checkpoints._manager is None:
                continue  # nothing saved yet
            checkpoints.manager.sync()
            written, checkpoints._writing = checkpoints._writing, None
            # TensorFlow's sync only waits: a failed background write shows as missing files.
            if written and checkpoints.options.enable_async and not tf.io.gfile.exists(
                    written + ".index"):
                error = _take_async_error(checkpoints.checkpoint)
                _remove(written + "_temp")  # on a full disk, as large as a checkpoint
                raise RuntimeError(
                    f"The asynchronous write of checkpoint {written} failed "
                    f"({_first_line(error, 300) if error else 'its files are missing'}). "
                    "The previous checkpoint is intact; relaunch to continue from it, or set "
                    "--config.trainer.async_checkpoint=off to see the error where it "
                    "happens.") from error

    def prepare_for_writes(self):
        """Call it with the workdir locked, before restoring and training: rewrites a
        missing or damaged state file from the checkpoint files (trainer/state/
        checkpoint_state.py), and removes what writes cut short left (`ckpt-N_temp`,
        which the manager renames only once complete; a full disk leaves one as large
        as a checkpoint)."""
        if not self.is_chief:
            return
        self.sync()
        if repair_state(self.directory) and self._manager is not None:
            self._manager = None  # read the repaired state
        for path in tf.io.gfile.glob(os.path.join(self.directory, "*_temp")):
            logging.warning("Removing %s, left by a checkpoint write that did not finish.",
                            path)
            _remove(path)

    def write(self, prefix):
        """Writes the state to `prefix` outside the rotation (e.g. the best checkpoint);
        every worker must call it, only the chief's files are kept."""
        if self.is_chief:
            try:
                return self.checkpoint.write(prefix)
            except Exception:
                _remove(prefix + "_temp")  # what the failed write holds (a full disk)
                raise
        scratch = tempfile.mkdtemp()
        self.checkpoint.write(os.path.join(scratch, "ckpt"))
        shutil.rmtree(scratch, ignore_errors=True)
        return prefix

    def restore(self, path=None):
        """Restores checkpoint `path`, or else the newest readable one; returns its path,
        or None if there is none.

        Nothing is ever deleted. Raises IncompatibleCheckpointError, before any
        variable is changed, for a checkpoint that reads fine but does not fit
        (see `check_fits`), RuntimeError when no checkpoint can be read.
        """
        self.sync()  # an asynchronous save of this process is complete
        if path:
            paths = [path]
        else:
            paths = listed_checkpoints(self.directory)
        self._before = {number(p) for p in found_on_disk(self.directory)}
        for remaining, path in reversed(list(enumerate(paths))):
            damage = None
            try:
                saved = saved_variables(path)
            except Exception:  # noqa: BLE001  (OpError, DecodeError... by damage)
                damage = read_error(path) or "its object graph cannot be read."
            if damage is None:
                check_fits(path, self.named, *saved)
                try:
                    self.checkpoint.restore(path).assert_consumed()
                except Exception as e:  # noqa: BLE001  (a value that cannot be read)
                    damage = read_error(path)
                    if damage is None:  # readable: something beside model and optimizer
                        raise IncompatibleCheckpointError(
                            f"Checkpoint {path} does not fit this run: {_first_line(e, 400)} "
                            "Relaunch with the config in the workdir's config.json, or use a "
                            "new --workdir.") from e
            if damage:
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


def async_checkpoint(trainer_config, strategy):
    """Whether saves are asynchronous. `trainer.async_checkpoint`: "on", "off", or
    "auto": on for the strategies of one process on CPU or GPU, where it is tested;
    off on TPU (not run here) and under MultiWorkerMirroredStrategy, where every
    worker saves together (a save holds collectives) and a background write
    would let one worker's files lag the others' (the non-chiefs wait for theirs)."""
    setting = on_off_auto(trainer_config, "async_checkpoint")
    if setting == "auto":
        return not isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy,
                                         tf.distribute.TPUStrategy))
    return setting


def check_fits(path, named, saved, version):
    """Raises IncompatibleCheckpointError unless every value of the `model` and
    `optimizer` nodes of checkpoint `path` lands in a variable of `named` ({node: {name:
    variable}}), every variable gets one, and shapes and dtypes match."""
    if version != LAYOUT_VERSION:
        raise IncompatibleCheckpointError(
            f"Checkpoint {path} has the checkpoint layout {version} of tftrainer 0.1 (Keras' "
            f"own object graph), which this version ({LAYOUT_VERSION}: every variable by "
            "name, see docs/checkpoints.md#strict-restore) does not resume. Finish that run "
            "with tftrainer 0.1, or "
            f"start a new --workdir from its weights with --config.init.checkpoint={path}. "
            "Nothing was changed.")
    found = {"missing": [], "unexpected": [], "mismatched": []}
    for node in SAVED_NODES:
        prefix = "" if node == "model" else f"{node}: "
        for kind, lines in zip(found, differences(named[node], saved.get(node, {}))):
            found[kind] += [prefix + line for line in lines]
    if not any(found.values()):
        return
    listed = "".join(
        f"\n  {kind} ({len(lines)}): " + "; ".join(lines[:8])
        + (f"; ... (+{len(lines) - 8})" if len(lines) > 8 else "")
        for kind, lines in found.items() if lines)
    raise IncompatibleCheckpointError(
        f"Checkpoint {path} does not fit this run (missing: in this run only; unexpected: "
        f"in the checkpoint only):{listed}\n{_hint(found)}It was written by a run with "
        "another model or optimizer config; the config of the run that wrote the workdir "
        "is in its config.json. Relaunch with that config to continue it, or use a new "
        f"--workdir to start from scratch (--config.init.checkpoint={path} starts from its "
        "weights). Nothing was changed.")


def _hint(found):
    """The likely cause when the only differences are an EMA's averages."""
    def averages(kind):
        return [line for line in found[kind] if line.startswith("optimizer: ")
                and line.split()[1].endswith("/average")]
    others = sum(len(lines) for lines in found.values())
    if averages("unexpected") and len(averages("unexpected")) == others:
        return ("The checkpoint holds an EMA of the weights that this run does not keep: set "
                "--config.optimizer.ema_decay to the value in config.json to resume. ")
    if averages("missing") and len(averages("missing")) == others:
        return ("This run keeps an EMA of the weights (optimizer.ema_decay > 0) that the "
                "checkpoint does not hold: turning the EMA on mid-run is not supported; set "
                "--config.optimizer.ema_decay=0 to resume. ")
    return ""


def _remove(path):
    """Removes a file or directory tree if it exists."""
    if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
    elif tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def _take_async_error(checkpoint):
    """The error of `checkpoint`'s failed background write, taken from TensorFlow's
    helper, which otherwise keeps it to raise at the next save or, at exit, as an
    "Exception ignored in atexit callback" traceback after the run has ended (private
    attributes of TF 2.21's AsyncCheckpointHelper; None where they differ)."""
    helper = getattr(checkpoint, "_async_checkpointer_impl", None)
    error = getattr(helper, "_async_error", None)
    if error is not None:
        helper._async_error = None
    return error


def read_error(path):
    """Why the files of checkpoint `path` cannot be read, or None if every tensor reads."""
    try:
        reader = checkpoint_reader(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as e:  # noqa: BLE001  (the reader raises many types on damage)
        return _first_line(e, 200)
    return None


def _first_line(error, limit):
    lines = str(error).strip().splitlines()
    line = (lines[0] if lines else "")[:limit].rstrip(".")
    return f"{type(error).__name__}: {line}."
