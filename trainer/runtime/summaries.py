"""TensorBoard summaries: one writer per run (`train`, `eval`) under the workdir."""

import os

import numpy as np
import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.plugins.scalar import metadata as scalar_metadata


class Summaries:
    """Writes scalars and text under `workdir/<run>`; a no-op on every process but the
    chief, so the code that writes never has to ask where it runs."""

    def __init__(self, workdir, is_chief):
        self.workdir, self.is_chief = workdir, is_chief
        self._writers = {}
        self._row_writers = {}  # run -> compiled `_write_rows` for that run's writer

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

    def per_step(self, run, names, values, first_step):
        """Writes row i of `values` [steps, len(names)] at step `first_step + i`, in one
        compiled call (a Python loop of scalar writes would cost more than the steps)."""
        if not self.is_chief or not len(values):
            return
        writer = self._writer(run)
        if run not in self._row_writers:  # a trace holds its writer: one function per writer
            # reduce_retracing: chunks of any length share one trace.
            self._row_writers[run] = tf.function(_write_rows, reduce_retracing=True)
        with writer.as_default():
            self._row_writers[run](tf.convert_to_tensor(values, tf.float32),
                                   tf.constant(first_step, tf.int64), tuple(names))
        writer.flush()

    def histograms(self, run, histograms, step):
        """Writes {name: (first bin's log2, counts per power of two)}, binned already in
        the compiled step, in the histogram plugin's format ([left, right, count] rows)."""
        writer = self._writer(run)
        with writer.as_default(step=tf.convert_to_tensor(step, tf.int64)):
            for name, (low, counts) in histograms.items():
                left = np.arange(low, low + len(counts), dtype=np.float64)
                buckets = np.stack([left, left + 1, np.asarray(counts, np.float64)], axis=1)
                tf.summary.write(name, buckets, metadata=histogram_metadata.
                                 create_summary_metadata(name, "log2 of |scaled gradient|"))
        writer.flush()

    def hparams(self, config):
        """The config, flattened (`trainer.train_steps`: 200, ...), for TensorBoard's
        HParams dashboard, in the workdir itself: with --logdir on a folder of runs,
        each workdir is one session there, its eval/ scalars the session's metrics."""
        values = {}

        def flatten(prefix, node):
            for key, value in node.items():
                if isinstance(value, dict):
                    flatten(f"{prefix}{key}.", value)
                else:
                    values[prefix + key] = (value if isinstance(value, (bool, int, float, str))
                                            else str(value))

        flatten("", config.to_dict())
        with self._writer("").as_default():
            hparams_api.hparams(values, trial_id=os.path.basename(self.workdir.rstrip("/")))
        self._writer("").flush()

    def image(self, run, name, image, step):
        """Writes one image [H, W, C] with values in [0, 1]."""
        writer = self._writer(run)
        with writer.as_default(step=tf.convert_to_tensor(step, tf.int64)):
            tf.summary.image(name, image[tf.newaxis])
        writer.flush()

    def text(self, run, name, text, step):
        with self._writer(run).as_default(step=tf.convert_to_tensor(step, tf.int64)):
            tf.summary.text(name, text)

    def flush(self):
        for writer in self._writers.values():
            writer.flush()


def _write_rows(values, first_step, names):
    for i in tf.range(tf.shape(values, out_type=tf.int64)[0]):
        for j, name in enumerate(names):  # write: scalar() would prefix the loop's scope
            tf.summary.write(name, values[i, j], step=first_step + i,
                             metadata=scalar_metadata.create_summary_metadata(name, ""))
