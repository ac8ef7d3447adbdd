"""The best checkpoint so far by an eval metric, in `workdir/best/`, and early stopping.

`best/best.json` names the best checkpoint, its step, its eval metrics and how
many evaluations since have not beaten it. The new checkpoint is written
first, under its own step's name, then the JSON (a temporary file
renamed over the old one), and only then are older files deleted: a kill at
any moment leaves a JSON naming a complete checkpoint. `best/` is outside the
rotation of `max_to_keep`, and the JSON is read back when a run resumes, so the
best is never forgotten.
"""

import math
import os
import re

import tensorflow as tf
from absl import logging

from trainer.loop.action import Action
from trainer.state.workdir import read_json

RECORD = "best.json"


class BestCheckpoint(Action):
    """Runs right after each evaluation. `mode` is "max" or "min"; with `patience` > 0
    the run stops once that many evaluations in a row did not improve `metric`."""

    kind = "checkpoint"

    def __init__(self, directory, metric, mode, patience=0):
        self.directory, self.metric, self.mode, self.patience = (
            directory, metric, mode, patience)
        self.path = os.path.join(directory, RECORD)
        self.record = None

    def begin(self, controller):
        """Reads best.json back; a run resumed after its early stop stays stopped
        (unless the patience grew)."""
        self.record = self._read()
        if self._patience_exhausted():
            controller.request_stop(self._stop_reason())

    def should_run(self, controller, step, logs):
        return self.metric in logs

    def __call__(self, controller, step, logs):
        if self.record is None:
            self.record = self._read()
        record, value = self.record, logs[self.metric]
        # The chief, which can read best.json, decides; every worker writes along
        # (a checkpoint write holds collectives).
        improved = controller.any_worker(controller.is_chief and self._improves(value, step))
        if improved:
            name = f"ckpt-{step}"  # a new name: the best of another step is never overwritten
            controller.trainer.checkpoints.write(os.path.join(self.directory, name))
            previous = record["value"]
            record.update(value=value, step=step, checkpoint=name, evals_since_best=0,
                          eval={k[len("eval/"):]: v for k, v in logs.items()
                                if k.startswith("eval/")})
            logging.info("New best %s=%.4g at step %d (previous: %s); saved %s.", self.metric,
                         value, step, "none" if previous is None else f"{previous:.4g}",
                         os.path.join(self.directory, name))
        elif record["last_eval_step"] is None or step > record["last_eval_step"]:
            # (a relaunch from an older checkpoint evaluates steps judged before its crash
            # again: they do not count twice)
            record["evals_since_best"] += 1
        record["last_eval_step"] = max(step, record["last_eval_step"] or 0)
        controller.files.write_json(self.path, record)
        for path in self._stale_files(record["checkpoint"]):
            controller.files.remove(path)
        if self._patience_exhausted():
            controller.request_stop(self._stop_reason())

    def _improves(self, value, step):
        best = self.record["value"]
        if not math.isfinite(value) or step == self.record["step"]:
            return False  # a step already best is not written again (in place)
        return best is None or (value > best if self.mode == "max" else value < best)

    def _patience_exhausted(self):
        return bool(self.patience) and self.record["evals_since_best"] >= self.patience

    def _stop_reason(self):
        best = self.record["value"]
        return (f"early stop: {self.metric} did not improve for {self.patience} evaluations "
                f"(best {'none' if best is None else f'{best:.4g}'} at step "
                f"{self.record['step']})")

    def _read(self):
        fresh = dict(metric=self.metric, mode=self.mode, value=None, step=None,
                     checkpoint=None, eval={}, evals_since_best=0, last_eval_step=None)
        record = read_json(self.path, "the best checkpoint's record")
        if record is None:
            return fresh
        if (record.get("metric"), record.get("mode")) != (self.metric, self.mode):
            raise ValueError(
                f"{self.path} keeps the best by {record.get('metric')} "
                f"({record.get('mode')}), but this run asks for {self.metric} ({self.mode}). "
                f"Set --config.trainer.best_metric={record.get('metric')} "
                f"--config.trainer.best_mode={record.get('mode')}, or move {self.directory} "
                "away to start a new best.")
        return dict(fresh, **record)

    def _stale_files(self, keep):
        """Checkpoint files in best/ other than `keep`'s, including the `<name>_temp/`
        directory a write killed midway leaves behind."""
        pattern = re.compile(r"ckpt-\d+(_temp|\.index|\.data-\d+-of-\d+)$")
        for path in tf.io.gfile.glob(os.path.join(self.directory, "ckpt-*")):
            name = os.path.basename(path.rstrip("/"))
            if pattern.match(name) and not name.startswith(f"{keep}.") and name != keep:
                yield path


def checkpoint_path(directory, record):
    """The best checkpoint's path: best.json names it relative to `directory`."""
    return os.path.join(directory, record["checkpoint"])

