"""TensorBoard summaries: one writer per run (`train`, `eval`) under the workdir."""

import os

import tensorflow as tf


class Summaries:
    """Writes scalars and text under `workdir/<run>`; a no-op on every process but the
    chief, so the code that writes never has to ask where it runs."""

    def __init__(self, workdir, is_chief):
        self.workdir, self.is_chief = workdir, is_chief
        self._writers = {}

    def _writer(self, run):
        if run not in self._writers:
            self._writers[run] = (
                tf.summary.create_file_writer(os.path.join(self.workdir, run)) if self.is_chief
                else tf.summary.create_noop_writer())
        return self._writers[run]

    def scalars(self, run, scalars, step):
        """Writes {name: value} at `step` and flushes, so TensorBoard sees it at once."""
        writer = self._writer(run)
        with writer.as_default(step=tf.convert_to_tensor(step, tf.int64)):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)
        writer.flush()

    def text(self, run, name, text, step):
        with self._writer(run).as_default(step=tf.convert_to_tensor(step, tf.int64)):
            tf.summary.text(name, text)

    def flush(self):
        for writer in self._writers.values():
            writer.flush()
