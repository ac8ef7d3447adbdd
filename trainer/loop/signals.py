"""Stopping on SIGTERM/SIGINT at the next loop boundary, with a checkpoint."""

import signal
import threading

from absl import logging


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint; `signum` says which."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum


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
