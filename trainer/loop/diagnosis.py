"""After a run stops for divergence: replay it from the last good state to the first
non-finite step, layer by layer, and say where it broke.

The data order is a function of the step and every checkpoint holds the whole state
(the dropout masks derive from the step), so the steps after the last good checkpoint
can be run again exactly, on the same batches. Each replayed step is first inspected
(trainer/step/inspection.py: every layer's outputs and gradients, no weight changed),
then run by the train step itself. At the first step that is non-finite again, the
inspection names the layer and check_numerics the op; trainer/loop/diagnosis_report.py
turns that into the fix and the command that resumes with it. The report goes to
`workdir/diagnosis.json`. The checkpoints are only read: nothing of the workdir's state
is written, and the process ends after the report.
"""

import os
import time

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.loop.diagnosis_report import report
from trainer.step.inspection import COLUMNS, StepInspection
from trainer.step.loss_scale import all_finite

DIAGNOSIS_FILE = "diagnosis.json"


def diagnose(controller, diverged, start_state=None):
    """Replays `controller`'s run up to the divergence `diverged` (a Diverged error) and
    returns the report (a dict, also written to workdir/diagnosis.json by the chief).
    `start_state`: an in-memory checkpoint of step 0, used when no checkpoint exists."""
    trainer = controller.trainer
    started = time.monotonic()
    budget = float(trainer.config.trainer.diagnose_max_seconds)
    trainer.checkpoints.sync()
    source = trainer.checkpoints.latest or start_state
    if source is None:
        found = {"outcome": "no_state"}
    else:
        replay = _Replay(controller, diverged, source, started + budget)
        found = replay.run()
        if found["outcome"] == "finite" and not trainer.config.trainer.deterministic:
            logging.warning("Diagnosis: the replay stayed finite up to step %d; replaying "
                            "again with deterministic ops.", diverged.step)
            tf.config.experimental.enable_op_determinism()  # this process ends after it
            found = dict(replay.run(), retried_deterministic=True)
    found.update(seconds=round(time.monotonic() - started, 2), budget_seconds=budget,
                 source=source if source != start_state else "the start of the run (step 0)")
    diagnosis = report(trainer, diverged, found)
    controller.files.write_json(os.path.join(trainer.workdir, DIAGNOSIS_FILE), diagnosis)
    return diagnosis


class _Replay:
    """The steps from the last good state to the divergence, each inspected, then run."""

    def __init__(self, controller, diverged, source, deadline):
        self.controller, self.diverged, self.source = controller, diverged, source
        self.deadline = deadline
        self.inspection = None

    def run(self):
        trainer, diverged = self.controller.trainer, self.diverged
        self._restore()
        if self.inspection is None:  # (wraps the layers' calls once)
            self.inspection = StepInspection(trainer)
        step_fn = tf.function(
            lambda features, labels: trainer.strategy.run(trainer.train_step,
                                                          args=(features, labels)),
            autograph=False)  # the train step itself, on a batch the replay holds
        iterator = iter(trainer.distributed_dataset("train"))
        # The non-finite steps that stopped the run; before them, a skipped step is the
        # dynamic loss scale coming down (float16), not the divergence.
        first_bad = (diverged.step - diverged.streak + 1 if diverged.weights_finite
                     else None)
        step = start = int(trainer.step.numpy())
        largest = np.zeros([0, len(COLUMNS)])
        replay_seconds = []
        while step < diverged.step:
            if self.controller.any_worker(time.monotonic() > self.deadline):
                return {"outcome": "gave_up", "replayed_from": start, "replayed_to": step,
                        "first_bad": first_bad}
            features, labels = next(iterator)
            scale = float(trainer.loss_scale.scale.numpy())
            began = time.monotonic()
            stats, loss_finite = self.inspection.inspect(features, labels, scale)
            inspected = time.monotonic()
            step_fn(features, labels)
            step = int(trainer.step.numpy())
            replay_seconds.append((inspected - began, time.monotonic() - inspected))
            finite = int(trainer.nonfinite_streak.numpy()) == 0
            common = {"replayed_from": start, "step": step, "first_bad": first_bad,
                      "paths": self.inspection.paths, "largest_before": largest,
                      "seconds_per_step": _medians(replay_seconds[1:] or replay_seconds)}
            if not finite and first_bad is not None and step >= first_bad:
                trainer.step.assign(step - 1)  # the skipped step changed nothing else
                return dict(common, **self._localized(features, labels, scale, stats,
                                                      loss_finite))
            bad = [name for name, v in trainer.variable_names.items()
                   if tf.as_dtype(v.dtype).is_floating and not bool(all_finite([v]))]
            if bad:
                return dict(common, outcome="update", variables=bad, stats=stats,
                            loss_scale=scale)
            if finite:
                largest = stats if not len(largest) else np.maximum(largest, stats)
        return {"outcome": "finite", "replayed_from": start, "step": step,
                "first_bad": first_bad}

    def _localized(self, features, labels, scale, stats, loss_finite):
        """The non-finite step seen again: the inspection's rows, the op check_numerics
        names (this worker's replicas), and under loss scaling the same pass unscaled."""
        found = {"outcome": "nonfinite", "stats": stats, "loss_finite": loss_finite,
                 "loss_scale": scale, "layers": self.inspection.layers}
        if scale != 1.0:
            found["unscaled"], _ = self.inspection.inspect(features, labels, 1.0)
        found["op"] = self.inspection.first_nonfinite_op(features, labels, scale)
        return found

    def _restore(self):
        trainer = self.controller.trainer
        if self.source.startswith("ram://"):
            trainer.checkpoints.checkpoint.read(self.source).assert_consumed()
        else:
            trainer.restore(self.source)
        trainer.nonfinite_streak.assign(0)
        logging.info("Diagnosis: replaying from %s (step %d) to step %d.", self.source,
                     int(trainer.step.numpy()), self.diverged.step)


def _medians(pairs):
    inspect, step = zip(*pairs)
    return {"inspection": round(float(np.median(inspect)), 4),
            "train_step": round(float(np.median(step)), 4)}
