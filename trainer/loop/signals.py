"""Stopping on SIGTERM/SIGINT at the next loop boundary, with a checkpoint; a full disk
told as such."""

import errno
import re
import signal
import threading

from absl import logging


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint; `signum` says which."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum


class DiskFull(Exception):
    """A write failed for lack of space; the checkpoints before it are complete."""

    EXIT_STATUS = errno.ENOSPC  # 28, as the C library numbers the error


def disk_full_path(error):
    """The path a write failed on for lack of space, "" if unnamed, or None when
    `error` (or what caused it) is no such failure."""
    while error is not None:
        text = str(error)
        if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or \
                "No space left on device" in text:
            named = re.search(r"(\S+); No space left on device", text)
            return named.group(1) if named else getattr(error, "filename", None) or ""
        error = error.__cause__ or error.__context__
    return None


class StopOnSignal:
    """Records SIGTERM/SIGINT instead of dying mid-step (main thread only).

    Our own flag rather than tf.distribute's PreemptionCheckpointHandler, which
    only serves MultiWorkerMirroredStrategy and TPUStrategy; the Controller
    shares the flag between workers.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum, self.previous = None, {}

    @property
    def name(self):
        return signal.Signals(self.signum).name if self.signum else "a signal to another worker"

    def _record(self, signum, frame):
        self.signum = signum
        logging.warning("Received %s: finishing the current loop, then saving a checkpoint.",
                        self.name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._record) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
