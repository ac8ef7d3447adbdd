"""The workdir lock where there is no OS lock (gs://): a lease that its owner renews.

tf.io.gfile offers an object store neither a lock nor a conditional write, so
the owner rewrites the lock file every HEARTBEAT_SECONDS with a new beat, and a
launch that finds the file watches it: a beat means a live run (refused), no
change for LEASE_SECONDS means a run that is gone (taken over). No clocks are
compared: the hosts' clocks and the store's may differ.

A takeover, or a first lock, writes its own token, waits SETTLE_SECONDS and reads
it back: of two launches whose writes land within that time, the last writer
keeps the lock and the other is refused. Writes further apart than the store's
own delays are ordered by the read back; closer ones (a few ms on gs://) could
both pass. A renewal that finds another token stops renewing and says so.
"""

import json
import threading
import time
import uuid

import tensorflow as tf
from absl import logging

gfile = tf.io.gfile


class LeaseLock:
    """A lease on `path` for `owner` ({pid, host, mode}, shown to others)."""

    HEARTBEAT_SECONDS = 10.0
    LEASE_SECONDS = 60.0
    SETTLE_SECONDS = 2.0

    def __init__(self, path, owner):
        self.path, self.owner = path, owner
        self._token = uuid.uuid4().hex
        self._beat = 0
        self._stop = threading.Event()
        self._thread = None

    def acquire(self):
        seen = self._read()
        if seen is not None:
            self._wait_until_expired(seen)
        self._write()
        time.sleep(self.SETTLE_SECONDS)
        now = self._read()
        if not self._ours(now):
            self._refuse(now, "it took the lock at the same moment")
        self._thread = threading.Thread(target=self._renew, name="workdir-lease", daemon=True)
        self._thread.start()
        return self

    def holder(self):
        """The owner written in the lock file (not watched: it may be gone), or None."""
        return _owner(self._read())

    def release(self):
        self._stop.set()
        if self._thread:
            self._thread.join()
        try:
            if self._ours(self._read()):
                gfile.remove(self.path)
        except tf.errors.OpError as e:  # the lease expires by itself
            logging.warning("Could not remove the lock %s (%s).", self.path, e.message)

    # ----------------------------------------------------------------- inside

    def _ours(self, text):
        return (_owner(text) or {}).get("token") == self._token

    def _text(self):
        return json.dumps({**self.owner, "token": self._token, "beat": self._beat})

    def _read(self):
        """The file's text, or None if there is none."""
        try:
            with gfile.GFile(self.path) as f:
                return f.read()
        except tf.errors.NotFoundError:
            return None

    def _write(self):
        """Writes a file of its own and renames it over the lock: a reader never sees half
        of it (and ram://, the tests' stand-in for gs://, appends to a file opened "w")."""
        own = f"{self.path}.{self._token}"
        with gfile.GFile(own, "w") as f:
            f.write(self._text())
        gfile.rename(own, self.path, overwrite=True)

    def _wait_until_expired(self, seen):
        """Returns once `seen` (the file's text) has stayed the same for LEASE_SECONDS or
        the file is gone; refuses if it changes (its owner renews it)."""
        logging.info("%s is held; watching it for up to %.0f s: a live run renews it every "
                     "%.0f s.", self.path, self.LEASE_SECONDS, self.HEARTBEAT_SECONDS)
        deadline = time.monotonic() + self.LEASE_SECONDS
        while time.monotonic() < deadline:
            time.sleep(min(1.0, self.HEARTBEAT_SECONDS / 4))
            now = self._read()
            if now is None:
                return
            if now != seen:
                self._refuse(now, "it renews its lease")
        owner = _owner(seen) or {}
        logging.warning("Taking over the lock %s of pid %s on %s: unchanged for %.0f s, so "
                        "its run is gone.", self.path, owner.get("pid"), owner.get("host"),
                        self.LEASE_SECONDS)

    def _refuse(self, text, why):
        owner = _owner(text) or {}
        raise RuntimeError(
            f"The workdir is in use: {self.path} is held by pid {owner.get('pid')} on host "
            f"{owner.get('host')} ({why}). Wait for that run to finish or use another "
            "--workdir.")

    def _renew(self):
        while not self._stop.wait(self.HEARTBEAT_SECONDS):
            try:
                now = self._read()
                if not self._ours(now):
                    logging.error("The workdir lock %s was taken over by pid %s on %s: two "
                                  "runs may now write this workdir. Stop one of them.",
                                  self.path, *(((_owner(now) or {}).get(k) for k in
                                                ("pid", "host"))))
                    return
                self._beat += 1
                self._write()
            except tf.errors.OpError as e:  # retried at the next beat, within the lease
                logging.warning("Could not renew the lock %s (%s).", self.path, e.message)


def _owner(text):
    try:
        owner = json.loads(text) if text else None
    except ValueError:
        return None
    return owner if isinstance(owner, dict) else None
