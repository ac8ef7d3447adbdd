"""The workdir: checks it is usable, locks it so two runs never write it at once, and
writes its files from the chief process only.

Every file goes through `tf.io.gfile`, so a workdir may live on any filesystem
TensorFlow supports (a local path, `gs://...`, `ram://...` in tests).
"""

import errno
import json
import os
import socket

import tensorflow as tf
from absl import logging

LOCK_NAME = ".lock"          # held by the run that writes checkpoints
EVAL_LOCK_NAME = ".eval_lock"  # held by a --mode=continuous_eval process
gfile = tf.io.gfile


def is_local(path):
    """A plain path on this machine's disk (not gs://, ram://, ...)."""
    return "://" not in path


def check_workdir(workdir):
    """Creates `workdir` if needed, or fails with what is wrong with it (nothing inside is
    touched)."""
    if gfile.exists(workdir) and not gfile.isdir(workdir):
        raise NotADirectoryError(f"--workdir={workdir} is a file, not a directory; "
                                 "choose another --workdir.")
    try:
        gfile.makedirs(workdir)
    except tf.errors.OpError as e:
        raise PermissionError(f"--workdir={workdir} cannot be created ({e.message}); "
                              "choose a writable --workdir.") from e
    if is_local(workdir) and not os.access(workdir, os.W_OK | os.X_OK):
        raise PermissionError(f"--workdir={workdir} is not writable; choose a writable "
                              "--workdir or fix its permissions.")


def check_readable_workdir(workdir, mode):
    """A mode that only reads a run (eval, sample, export of the workdir's own
    checkpoints) fails on a workdir that does not exist, before creating anything
    there (a summary, a lock)."""
    if not gfile.isdir(workdir):
        raise FileNotFoundError(
            f"--mode={mode}: --workdir={workdir} does not exist, so it holds no run to read "
            "(nothing was created). Point --workdir at a trained run's directory.")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True


class WorkdirLock:
    """`workdir/.lock` holding the owner's pid and host.

    A second run on the same workdir fails with the owner named. A lock left
    by a dead process on this host is taken over with a warning; one from
    another host cannot be checked, so the error says how to remove it.

    On a local disk the lock is atomic (O_CREAT|O_EXCL): of two runs started
    at once exactly one gets it. Remote filesystems (gs://) have no such
    primitive through tf.io.gfile, so there the lock is check-then-write: it
    stops a run started on a workdir another run is using, but two runs
    started within the same moment may both pass.
    """

    def __init__(self, workdir, name=LOCK_NAME, mode=None):
        self.path = os.path.join(workdir, name)
        self.owner = {"pid": os.getpid(), "host": socket.gethostname(), "mode": mode}
        self.held = False

    def acquire(self):
        while not self._create():
            self._handle_existing()
        self.held = True
        return self

    def _create(self):
        """Writes the lock file if none exists; False if one does."""
        text = json.dumps(self.owner)
        if is_local(self.path):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return True
        if gfile.exists(self.path):
            return False
        with gfile.GFile(self.path, "w") as f:
            f.write(text)
        return True

    def _handle_existing(self):
        owner = _read_owner(self.path)
        pid, host = owner.get("pid"), owner.get("host")
        if _is_stale(owner):
            logging.warning("Taking over the stale lock %s of pid %d on %s (no longer "
                            "running).", self.path, pid, host)
            self._remove()
            return
        raise RuntimeError(
            f"The workdir is in use: {self.path} is held by pid {pid} on host {host}. "
            "Wait for that run to finish or use another --workdir; if that process is "
            f"gone, delete {self.path}.")

    def _remove(self):
        try:
            gfile.remove(self.path)
        except tf.errors.NotFoundError:
            pass

    def release(self):
        if self.held:
            self.held = False
            self._remove()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _read_owner(path):
    try:
        with gfile.GFile(path) as f:
            return json.load(f)
    except (tf.errors.OpError, ValueError):
        return {}


def _is_stale(owner):
    """Written by a process of this host that is no longer running."""
    pid = owner.get("pid")
    return owner.get("host") == socket.gethostname() and isinstance(pid, int) and not _alive(pid)


def lock_holder(workdir, name):
    """The owner ({pid, host, mode}) of lock `name` in `workdir`, or None if it is free
    or stale."""
    path = os.path.join(workdir, name)
    if not gfile.exists(path):
        return None
    owner = _read_owner(path)
    return None if _is_stale(owner) else owner


class ChiefFiles:
    """Writes and deletes workdir files on the chief; a no-op on every other process,
    so the code that writes never has to ask where it runs (like `Summaries`)."""

    def __init__(self, is_chief):
        self.is_chief = is_chief

    def write_text(self, path, text):
        """Atomically where the filesystem allows: a temporary file renamed over `path`,
        so a reader (or a kill) never sees half a file."""
        if self.is_chief:
            gfile.makedirs(os.path.dirname(path))
            with gfile.GFile(path + ".tmp", "w") as f:
                f.write(text)
            gfile.rename(path + ".tmp", path, overwrite=True)

    def write_json(self, path, value):
        self.write_text(path, json.dumps(value, indent=2))

    def remove(self, path):
        """Deletes a file or a whole directory."""
        if not self.is_chief:
            return
        if gfile.isdir(path):
            gfile.rmtree(path)
        else:
            gfile.remove(path)


def read_json(path, what):
    """The JSON in `path`, None if there is none; a damaged file is a clear error."""
    if not gfile.exists(path):
        return None
    try:
        with gfile.GFile(path) as f:
            return json.loads(f.read())
    except ValueError as e:
        raise ValueError(f"{path} ({what}) is not valid JSON ({e}). Move it away; "
                         "nothing was changed.") from e
