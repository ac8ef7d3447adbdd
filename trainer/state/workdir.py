"""The workdir: checks it is usable, locks it so two runs never write it at once, and
writes its files from the chief process only.

Every file goes through `tf.io.gfile`, so a workdir may live on any filesystem
TensorFlow supports (a local path, `gs://...`, `ram://...` in tests).
"""

import errno
import fcntl
import glob
import json
import os
import re
import socket
import time

import tensorflow as tf
from absl import logging

from trainer.state.lease_lock import LeaseLock

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


# Files a run writes, at each depth it writes them: a data glob that matches one of them
# would read the run's own files as data.
_RUN_FILES = ("summary.json", "checkpoints/ckpt-1.index", "train/events.out.tfevents.1.host",
              "export/1/variables/variables.index", "export/1/assets.extra/export.json")


def check_outside_data(workdir, data_paths):
    """Refuses a local `workdir` inside a data folder of `data_paths`, or whose files a
    data glob of them would match (`**` included)."""
    if not is_local(workdir):
        return
    root = os.path.abspath(workdir)
    for path in data_paths:
        if "://" in path:
            continue
        path = os.path.abspath(os.path.expanduser(path))
        if glob.has_magic(path):
            pattern = _glob_regex(path)
            hit = next((os.path.join(root, f) for f in _RUN_FILES
                        if pattern.fullmatch(os.path.join(root, f))), None)
        else:
            hit = root if root == path or root.startswith(path + os.sep) else None
        if hit:
            raise ValueError(
                f"--workdir={workdir} is inside the data ({path}): the run's own files "
                f"({hit}) would be read as data, and the data would change between "
                "launches. Choose a --workdir outside it.")


def _glob_regex(pattern):
    """A regex of what glob.glob(pattern, recursive=True) matches."""
    regex = ""
    for part in re.split(r"(\*\*/|\*\*|\*|\?|\[[^\]/]+\])", pattern):
        if part == "**/":
            regex += "(?:.*/)?"
        elif part in ("**", "*"):
            regex += ".*" if part == "**" else "[^/]*"
        elif part == "?":
            regex += "[^/]"
        elif part.startswith("[") and len(part) > 2:
            regex += "[^" + part[2:] if part[1] == "!" else part
        else:
            regex += re.escape(part)
    return re.compile(regex)


def check_readable_workdir(workdir, mode):
    """A mode that only reads a run (eval, sample, export of the workdir's own
    checkpoints) fails on a workdir that does not exist, before creating anything
    there (a summary, a lock)."""
    if not gfile.isdir(workdir):
        raise FileNotFoundError(
            f"--mode={mode}: --workdir={workdir} does not exist, so it holds no run to read "
            "(nothing was created). Point --workdir at a trained run's directory.")


class WorkdirLock:
    """`workdir/.lock`: one run writes a workdir at a time, a live run is never taken over
    and a dead one never blocks. The file names its owner ({pid, host, mode}) for errors.

    Where the filesystem has OS locks (a local disk; NFS with its lock service) the
    lock is `flock` on that file. The kernel holds it for the process and drops it when
    the process ends, however it ends (SIGKILL, an OOM kill, a container's PID 1), and
    it holds across PID namespaces and containers of one kernel. No pid is ever
    compared: pids repeat across namespaces and relaunches.

    Elsewhere (gs://, whose tf.io.gfile has no lock and no compare-and-swap) it is a
    lease (`LeaseLock`).
    """

    RETRY_SECONDS = 2.0  # a `lock_holder` probe holds the OS lock for an instant

    def __init__(self, workdir, name=LOCK_NAME, mode=None):
        self.path = os.path.join(workdir, name)
        self.owner = {"pid": os.getpid(), "host": socket.gethostname(), "mode": mode}
        self._fd = None    # the open, flock-ed lock file
        self._lease = None  # a LeaseLock where the filesystem has no OS lock

    @property
    def held(self):
        return self._fd is not None or self._lease is not None

    def acquire(self):
        if not is_local(self.path):
            self._lease = LeaseLock(self.path, self.owner).acquire()
            return self
        deadline = time.monotonic() + self.RETRY_SECONDS
        while True:
            try:
                fd = _locked_file(self.path)
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                owner = _read_owner(self.path)
                raise RuntimeError(
                    f"The workdir is in use: {self.path} is held by pid {owner.get('pid')} on "
                    f"host {owner.get('host')}. Wait for that run to finish or use another "
                    "--workdir.") from None
            except _NoOsLock as e:
                logging.warning("%s has no OS locks (%s): the workdir lock is a lease.",
                                self.path, e)
                self._lease = LeaseLock(self.path, self.owner).acquire()
                return self
            if fd is not None:
                break
        left = _read_owner(self.path)
        if left:  # (an empty file: a power loss before its owner wrote it)
            logging.warning("Taking over the stale lock %s of pid %s on %s: no process holds "
                            "it (that run ended without releasing it).", self.path,
                            left.get("pid"), left.get("host"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.owner).encode(), 0)
        self._fd = fd
        return self

    def release(self):
        if self._lease:
            self._lease, lease = None, self._lease
            lease.release()
        if self._fd is not None:
            self._fd, fd = None, self._fd
            # Still ours (the path names our file): remove it, then unlock by closing.
            if _same_file(fd, self.path):
                os.unlink(self.path)
            os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


class _NoOsLock(OSError):
    """The filesystem of the lock file has no `flock`."""


def _locked_file(path):
    """An open descriptor of `path` holding its exclusive flock; None when the file was
    removed or replaced before the lock was taken (try again); BlockingIOError while
    another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise _NoOsLock(e.errno, e.strerror) from e
        raise
    # The owner's release unlinks the file before it unlocks: a lock on a file no
    # longer at `path` is no lock on the workdir.
    if not _same_file(fd, path):
        os.close(fd)
        return None
    return fd


def _same_file(fd, path):
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _read_owner(path):
    try:
        with gfile.GFile(path) as f:
            owner = json.load(f)
    except (tf.errors.OpError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def lock_holder(workdir, name):
    """The owner ({pid, host, mode}) of lock `name` in `workdir` while a live process holds
    it, else None."""
    path = os.path.join(workdir, name)
    if not gfile.exists(path):
        return None
    if not is_local(path):
        return LeaseLock(path, {}).holder()
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_owner(path)
    except OSError:  # no OS locks here: the lease's word
        return LeaseLock(path, {}).holder()
    finally:
        os.close(fd)
    return None


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
