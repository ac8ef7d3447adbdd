"""The workdir: checks it is usable and locks it so two runs never write it at once."""

import errno
import json
import os
import socket

from absl import logging

LOCK_NAME = ".lock"


def check_workdir(workdir):
    """Creates `workdir` or fails with what is wrong with it (nothing inside is touched)."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(f"--workdir={workdir} is a file, not a directory; "
                                 "choose another --workdir.")
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise PermissionError(f"--workdir={workdir} cannot be created ({e.strerror}); "
                              "choose a writable --workdir.") from e
    if not os.access(workdir, os.W_OK | os.X_OK):
        raise PermissionError(f"--workdir={workdir} is not writable; choose a writable "
                              "--workdir or fix its permissions.")


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
    """

    def __init__(self, workdir):
        self.path = os.path.join(workdir, LOCK_NAME)
        self.owner = {"pid": os.getpid(), "host": socket.gethostname()}
        self.held = False

    def acquire(self):
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._handle_existing()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self.owner, f)
            self.held = True
            return self

    def _handle_existing(self):
        try:
            with open(self.path) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            owner = {}
        pid, host = owner.get("pid"), owner.get("host")
        if host == self.owner["host"] and isinstance(pid, int) and not _alive(pid):
            logging.warning("Taking over the stale lock %s of pid %d on %s (no longer "
                            "running).", self.path, pid, host)
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            return
        raise RuntimeError(
            f"The workdir is in use: {self.path} is held by pid {pid} on host {host}. "
            "Wait for that run to finish or use another --workdir; if that process is "
            f"gone, delete {self.path}.")

    def release(self):
        if self.held:
            self.held = False
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
