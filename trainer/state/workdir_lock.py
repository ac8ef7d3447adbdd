"""The workdir lock: one run writes a workdir at a time.

On a local disk it imports no TensorFlow, so a process that only holds a lock (the
tests' stand-ins for a run in a container) starts in a fraction of a second.
"""

import errno
import fcntl
import json
import os
import socket
import time

from absl import logging

LOCK_NAME = ".lock"          # held by the run that writes checkpoints
EVAL_LOCK_NAME = ".eval_lock"  # held by a --mode=continuous_eval process


def is_local(path):
    """A plain path on this machine's disk (not gs://, ram://, ...)."""
    return "://" not in path


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
            return self._acquire_lease()
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
                return self._acquire_lease()
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

    def _acquire_lease(self):
        from trainer.state.lease_lock import LeaseLock  # (TensorFlow's gfile: imported late)
        self._lease = LeaseLock(self.path, self.owner).acquire()
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
    try:
        fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        fd, created = os.open(path, os.O_RDWR), False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            if created:  # (the lease would take this empty file for a lock to watch)
                os.unlink(path)
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
        with open(path) as f:
            owner = json.load(f)
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def lock_holder(workdir, name):
    """The owner ({pid, host, mode}) of lock `name` in `workdir` while a live process holds
    it, else None."""
    path = os.path.join(workdir, name)
    if not is_local(path):
        from trainer.state.lease_lock import LeaseLock
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
        from trainer.state.lease_lock import LeaseLock
        return LeaseLock(path, {}).holder()
    finally:
        os.close(fd)
    return None
