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

from trainer.loop.diagnosis_report import origin, report
from trainer.runtime.settings import synchronizing_layers
from trainer.state.checkpoint_state import listed_checkpoints, number
from trainer.step.inspection import COLUMNS, StepInspection
from trainer.step.loss_scale import all_finite

DIAGNOSIS_FILE = "diagnosis.json"


def diagnose(controller, diverged, start_state=None):
    """Replays `controller`'s run up to the divergence `diverged` (a Diverged error) and
    returns the report (a dict, also written to workdir/diagnosis.json by the chief).
    `start_state`: an in-memory checkpoint of step 0, for a run with no checkpoint
    before the divergence. Op determinism, once enabled for a second replay, stays on
    in this process."""
    trainer = controller.trainer
    started = time.monotonic()
    budget = float(trainer.config.trainer.diagnose_max_seconds)
    source = _last_good_state(trainer, diverged) or start_state
    if source is None:
        found = {"outcome": "no_state"}
    else:
        replay = _Replay(controller, diverged, source, started + budget)
        found = replay.run()
        if found["outcome"] == "finite" and not trainer.config.trainer.deterministic:
            logging.warning("Diagnosis: the replay stayed finite up to step %d; replaying "
                            "again with deterministic ops.", diverged.step)
            try:
                tf.config.experimental.enable_op_determinism()
                found = dict(replay.run(), retried_deterministic=True)
            except Exception as error:  # noqa: BLE001  (an op with no deterministic kernel)
                found["retry_failed"] = f"{type(error).__name__}: {str(error)[:300]}"
    found.update(seconds=round(time.monotonic() - started, 2), budget_seconds=budget,
                 source=source if source != start_state else "the start of the run (step 0)")
    diagnosis = report(trainer, diverged, found)
    controller.files.write_json(os.path.join(trainer.workdir, DIAGNOSIS_FILE), diagnosis)
    return diagnosis


def _last_good_state(trainer, diverged):
    """The newest checkpoint before the steps that stopped the run: a checkpoint saved
    during a non-finite streak shorter than max_nonfinite_steps is after its start."""
    trainer.checkpoints.sync()
    first_bad = (diverged.step - diverged.streak + 1 if diverged.weights_finite
                 else diverged.step)
    before = [p for p in listed_checkpoints(trainer.checkpoints.directory)
              if number(p) < first_bad]
    return before[-1] if before else None


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
            if self._out_of_time():
                return {"outcome": "gave_up", "replayed_from": start, "replayed_to": step,
                        "first_bad": first_bad}
            features, labels = next(iterator)
            scale = float(trainer.loss_scale.scale.numpy())
            began = time.monotonic()
            stats, batch = self.inspection.inspect(features, labels, scale)
            inspected = time.monotonic()
            step_fn(features, labels)
            step = int(trainer.step.numpy())
            replay_seconds.append((inspected - began, time.monotonic() - inspected))
            finite = int(trainer.nonfinite_streak.numpy()) == 0
            common = {"replayed_from": start, "step": step, "first_bad": first_bad,
                      "paths": self.inspection.paths, "layers": self.inspection.layers,
                      "parents": self.inspection.parents, "largest_before": largest,
                      "seconds_per_step": _medians(replay_seconds[1:])}
            if not finite and first_bad is not None and step >= first_bad:
                # A skipped step changed no weight, but moved the step (and under float16
                # the loss scale): the step is put back for the same dropout masks.
                trainer.step.assign(step - 1)
                return dict(common, **self._localized(features, labels, scale, stats, batch))
            weights = [v for v in trainer.variable_names.values()
                       if tf.as_dtype(v.dtype).is_floating]
            if not bool(all_finite(weights)):
                bad = [name for name, v in trainer.variable_names.items()
                       if tf.as_dtype(v.dtype).is_floating and not bool(all_finite([v]))]
                return dict(common, outcome="update", variables=bad, stats=stats,
                            loss_scale=scale)
            if finite:
                largest = stats if not len(largest) else np.maximum(largest, stats)
        return {"outcome": "finite", "replayed_from": start, "step": step,
                "first_bad": first_bad}

    def _out_of_time(self):
        """Every worker agrees (a replayed step holds collectives)."""
        return self.controller.any_worker(time.monotonic() > self.deadline)

    def _localized(self, features, labels, scale, stats, batch):
        """The non-finite step seen again: the inspection's rows; under loss scaling the
        same pass unscaled; the op check_numerics names (this worker's replicas) while
        there is time, and where no layer all-reduces in its forward pass."""
        trainer = self.controller.trainer
        found = {"outcome": "nonfinite", "stats": stats, "batch": batch, "loss_scale": scale,
                 "jit_compile": trainer.jit_compile is True}
        if scale != 1.0 and not self._out_of_time():
            found["unscaled"], _ = self.inspection.inspect(features, labels, 1.0)
        _, path = origin(dict(zip(self.inspection.paths, stats)), self.inspection.parents)
        if path and self.inspection.layers[path].compute_dtype != "float32" and \
                not self._out_of_time():  # would float32 there fix it? Try it.
            found["finite_in_float32"] = self.inspection.finite_in_float32(
                path, features, labels, scale)
        collective = (self.controller.multi_worker
                      and synchronizing_layers(list(self.inspection.layers.values())))
        if collective:
            found["op"] = {"op": None, "why": "not searched: a layer all-reduces in its "
                           "forward pass, which check_numerics would leave waiting"}
        elif self._out_of_time():
            found["op"] = {"op": None, "why": "not searched: trainer.diagnose_max_seconds"}
        else:
            found["op"] = self.inspection.first_nonfinite_op(features, labels, scale)
        return found

    def _restore(self):
        trainer = self.controller.trainer
        if self.source.startswith("ram://"):
            # Our own write of the same object; only the save counter, which a save made
            # since, is not in it.
            trainer.checkpoints.checkpoint.read(self.source).expect_partial()
        else:
            trainer.restore(self.source)
        trainer.nonfinite_streak.assign(0)
        logging.info("Diagnosis: replaying from %s (step %d) to step %d.", self.source,
                     int(trainer.step.numpy()), self.diverged.step)


def _medians(pairs):
    """Median seconds of the replayed steps after the first (which traced), if any."""
    if not pairs:
        return None
    inspect, step = zip(*pairs)
    return {"inspection": round(float(np.median(inspect)), 4),
            "train_step": round(float(np.median(step)), 4)}
