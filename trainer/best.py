"""The best checkpoint so far by an eval metric, in `workdir/best/`, and early stopping.

`best/best.json` names the best checkpoint, its step, its eval metrics and how
many evaluations since have not beaten it. The new checkpoint is written
first, then the JSON (to a temporary file renamed over the old one), and only
then are the older files deleted: a kill at any moment leaves a JSON naming a
complete checkpoint. `best/` is outside the rotation of `max_to_keep`, and
the JSON is read back when a run resumes, so the best is never forgotten.
"""

import json
import math
import os

import tensorflow as tf
from absl import logging

from trainer.actions import Action

RECORD = "best.json"


class BestCheckpoint(Action):
    """Runs right after each evaluation. `mode` is "max" or "min"; with `patience` > 0
    the run stops once that many evaluations in a row did not improve `metric`."""

    def __init__(self, directory, metric, mode, patience=0):
        self.directory, self.metric, self.mode, self.patience = (
            directory, metric, mode, patience)
        self.record = None  # read from best.json on first use

    def begin(self, controller):
        """A run resumed after its early stop stays stopped (unless patience grew)."""
        self.record = self._read()
        if self._patience_exhausted() and controller.is_chief:
            controller.request_stop(self._stop_reason())

    def should_run(self, controller, step, logs):
        return self.metric in logs

    def __call__(self, controller, step, logs):
        record = self.record or self._read()
        value = logs[self.metric]
        # The chief, which can read best.json, decides; every worker writes along
        # (a checkpoint write holds collectives).
        improved = controller.any_worker(controller.is_chief and self._improves(value, record))
        if improved:
            name = f"ckpt-{step}"
            controller.trainer.checkpoints.write(os.path.join(self.directory, name))
            previous = record["value"]
            record.update(value=value, step=step, checkpoint=name, evals_since_best=0,
                          eval={k[len("eval/"):]: v for k, v in logs.items()
                                if k.startswith("eval/")})
            logging.info("New best %s=%.4g at step %d (previous: %s); saved %s.", self.metric,
                         value, step, "none" if previous is None else f"{previous:.4g}",
                         os.path.join(self.directory, name))
        elif step != record["last_eval_step"]:  # a step judged before does not count twice
            record["evals_since_best"] += 1
        record["last_eval_step"] = step
        self.record = record
        if controller.is_chief:
            self._write(record)
            self._remove_all_but(record["checkpoint"])
            if self._patience_exhausted():
                controller.request_stop(self._stop_reason())

    def _patience_exhausted(self):
        return bool(self.patience) and self.record["evals_since_best"] >= self.patience

    def _stop_reason(self):
        best = self.record["value"]
        return (f"early stop: {self.metric} did not improve for {self.patience} evaluations "
                f"(best {'none' if best is None else f'{best:.4g}'} at step "
                f"{self.record['step']})")

    def _improves(self, value, record):
        if not math.isfinite(value):
            return False
        if record["value"] is None:
            return True
        return value > record["value"] if self.mode == "max" else value < record["value"]

    @property
    def path(self):
        return os.path.join(self.directory, RECORD)

    def _read(self):
        fresh = dict(metric=self.metric, mode=self.mode, value=None, step=None,
                     checkpoint=None, eval={}, evals_since_best=0, last_eval_step=None)
        if not tf.io.gfile.exists(self.path):
            return fresh
        with tf.io.gfile.GFile(self.path) as f:
            record = json.load(f)
        if (record.get("metric"), record.get("mode")) != (self.metric, self.mode):
            raise ValueError(
                f"{self.path} keeps the best by {record.get('metric')} "
                f"({record.get('mode')}), but this run asks for {self.metric} ({self.mode}). "
                f"Set --config.trainer.best_metric={record.get('metric')} "
                f"--config.trainer.best_mode={record.get('mode')}, or move {self.directory} "
                "away to start a new best.")
        return dict(fresh, **record)

    def _write(self, record):
        tf.io.gfile.makedirs(self.directory)
        temporary = self.path + ".tmp"
        with tf.io.gfile.GFile(temporary, "w") as f:
            f.write(json.dumps(record, indent=2))
        tf.io.gfile.rename(temporary, self.path, overwrite=True)

    def _remove_all_but(self, name):
        for path in tf.io.gfile.glob(os.path.join(self.directory, "ckpt-*")):
            if os.path.basename(path).split(".")[0] != name:
                tf.io.gfile.remove(path)
