"""Actions: what the host does between compiled chunks of train steps.

The Controller runs the compiled loop up to the next step where an action is
due, then calls the due actions in order. Logging, checkpointing, evaluation
and the best checkpoint are actions like the ones a user writes:

    class PrintLoss(Action):
        def __call__(self, controller, step, logs):
            print(step, logs["train/loss"])

and adds from a config, with no change to the framework:

    c.actions.print_loss = dict(action="my_actions.PrintLoss", every=100)

`logs` holds what the actions before this one produced at this step:
`train/<metric>` when the train metrics were logged, `eval/<metric>` when the
model was evaluated.
"""

import sys

import keras
from absl import logging

from trainer.loop.goodput import bottleneck, breakdown
from trainer.runtime.plugins import import_object
from trainer.step.evaluation import format_metrics, with_metrics_of_loss
from trainer.step.optimizers import build_learning_rate


class Action:
    """Something to do at some steps. Subclass it and implement `__call__`.

    every: run at steps that are multiples of it (0: never in mid-run).
    at_end: also run once training is over (train_steps reached, or an early
        stop).
    on_interrupt: also run when a signal or the time budget stops the run to
        be resumed later; other actions are skipped then, to save quickly.
    chief_only: run on the chief process alone (for actions that only write
        files). Otherwise every worker calls it at the same step, so it may
        hold collectives (save, evaluate) under MultiWorkerMirroredStrategy.
    kind: where its time goes in `summary.json` ("eval", "checkpoint", "other").
    """

    every = 0
    at_end = True
    on_interrupt = False
    chief_only = False
    kind = "other"

    def begin(self, controller):
        """Called once before the first step of `Controller.train`, on every worker."""

    def end(self, controller):
        """Called once when `Controller.train` ends, however it ends (an exception too),
        on every worker: release what the action holds."""

    def boundaries(self):
        """Steps, besides the multiples of `every`, where a compiled chunk must end so
        that `should_run` sees them."""
        return ()

    def should_run(self, controller, step, logs):
        """Whether to run at this boundary (`controller.done`: training is over;
        `controller.interrupted`: why the run stops to be resumed, or None)."""
        return (every(step, self.every) or (self.at_end and controller.done)
                or (self.on_interrupt and controller.interrupted is not None))

    def __call__(self, controller, step, logs):
        raise NotImplementedError


class LogTrain(Action):
    """Train metrics, learning rate, loss scale and throughput: a log line, `train/`
    summaries and `logs["train/..."]`."""

    on_interrupt = True

    def __init__(self, every):
        self.every = every
        self._last = None  # (step, the controller's seconds by kind, clock) at the last log

    def __call__(self, controller, step, logs):
        last_step, last_seconds, last_time = self._last or (
            controller.start_step, {}, controller.loop_started)
        if step == last_step:
            return  # nothing trained since the previous log
        trainer = controller.trainer
        now = controller.clock()
        spent = {k: v - last_seconds.get(k, 0.0) for k, v in controller.seconds.items()}
        seconds = spent["train"]  # evaluation and saves excluded
        self._last = (step, dict(controller.seconds), now)
        # Where the loop's time went since the last log (time/ in TensorBoard).
        shares = breakdown(spent, now - last_time)
        results = train_results(trainer)
        steps_per_sec = (step - last_step) / max(seconds, 1e-9)
        examples_per_sec = steps_per_sec * trainer.examples_per_step
        scalars = dict(results, steps_per_sec=steps_per_sec, examples_per_sec=examples_per_sec)
        tokens = ""
        if trainer.task.tokens_per_example:
            scalars["tokens_per_sec"] = examples_per_sec * trainer.task.tokens_per_example
            tokens = f", {scalars['tokens_per_sec']:.0f} tokens/s"
        mfu = trainer.utilization.mfu(steps_per_sec)
        if mfu is not None:
            scalars["mfu"] = mfu
            tokens += f", MFU {mfu:.1%}"
        controller.summaries.scalars("train", {  # the others went out at every step
            **{k: v for k, v in scalars.items()
               if not (trainer.per_step_summaries and k in trainer.PER_STEP_SCALARS)},
            **{f"time/{k}": v for k, v in shares.items()}}, step)
        bound = bottleneck(shares, trainer.task.input_remedy())
        logs.update({f"train/{k}": v for k, v in scalars.items()})
        shown = {m.name for m in trainer.train_metrics} | set(trainer.task.metrics_of_loss())
        metrics = {k: v for k, v in results.items() if k in shown}  # derived already
        eta = (trainer.train_steps - step) / max(steps_per_sec, 1e-9)
        logging.info("step %d/%d: %s | %.0f ex/s%s, %.2f steps/s, ETA %s%s", step,
                     trainer.train_steps, format_metrics(metrics), examples_per_sec, tokens,
                     steps_per_sec, format_duration(eta), f" | {bound}" if bound else "")


def train_results(trainer):
    """The train metrics since the last call, with the learning rate the last step used
    (as per-step summaries write it; the optimizer's `learning_rate` is the next
    step's), the current loss scale and the skipped steps; resets the metrics."""
    results = with_metrics_of_loss(trainer.task, {m.name: float(m.result())
                                                  for m in trainer.train_metrics})
    schedule = build_learning_rate(trainer.config.optimizer, trainer.train_steps)
    last_step = max(int(trainer.step.numpy()) - 1, 0)
    results.update(
        learning_rate=float(schedule(last_step) if callable(schedule) else schedule),
        loss_scale=float(trainer.loss_scale.scale.numpy()),
        grad_norm=float(trainer.grad_norm.result()),
        skipped_steps=float(trainer.loss_scale.skipped_steps.numpy()))
    for m in trainer.train_metrics + [trainer.grad_norm]:
        m.reset_state()
    return results


class ProgressBar(Action):
    """A live bar on a terminal (stdout a TTY): steps/total, loss, examples/sec, ETA,
    updated at every loop boundary; Keras' Progbar draws it. It counts this run's
    steps (a resumed run's bar starts at 0 of the steps left), so its ETA holds."""

    on_interrupt, chief_only = True, True

    def __init__(self):
        self.bar, self.loss, self._last = None, None, None

    def should_run(self, controller, step, logs):
        return True

    def __call__(self, controller, step, logs):
        trainer = controller.trainer
        if self.bar is None:
            self.bar = keras.utils.Progbar(trainer.train_steps - controller.start_step,
                                           unit_name="step", stateful_metrics=["loss", "ex/s"])
        last_step, last_seconds = self._last or (controller.start_step, 0.0)
        values = []
        if step > last_step:
            seconds = max(controller.train_seconds - last_seconds, 1e-9)
            values.append(("ex/s", (step - last_step) * trainer.examples_per_step / seconds))
        self._last = (step, controller.train_seconds)
        self.loss = logs.get("train/loss", self.loss)
        if self.loss is not None:
            values.append(("loss", self.loss))
        self.bar.update(step - controller.start_step, values,
                        finalize=controller.done or controller.interrupted is not None or None)


class SaveCheckpoint(Action):
    """Saves `workdir/checkpoints/ckpt-<step>`, also when the run stops early (a signal,
    the time budget, early stopping). Every worker calls it: a save holds collectives."""

    on_interrupt = True
    kind = "checkpoint"

    def __init__(self, every):
        self.every = every

    def __call__(self, controller, step, logs):
        controller.trainer.checkpoints.save()


class Evaluate(Action):
    """One pass over the eval split: `eval/` summaries at the step and `logs["eval/..."]`."""

    kind = "eval"

    def __init__(self, every):
        self.every = every

    def __call__(self, controller, step, logs):
        # (per-batch calls on one worker and one compiled pass on the others would not
        # match their collectives under MultiWorkerMirroredStrategy)
        results = controller.trainer.evaluate(progress=sys.stdout.isatty() and
                                              not controller.multi_worker)
        controller.summaries.scalars("eval", results, step)
        logs.update({f"eval/{k}": v for k, v in results.items()})
        controller.last_eval = results


class FunctionAction(Action):
    """A plain function `fn(controller, step, logs, **kwargs)` as an action."""

    def __init__(self, fn, **kwargs):
        self.fn, self.kwargs = fn, kwargs

    def __call__(self, controller, step, logs):
        self.fn(controller, step, logs, **self.kwargs)


def from_config(actions_config):
    """The user's actions, from `config.actions`: {name: {action: "module.Name",
    every: N, at_end: bool, **constructor keyword arguments}}, in name order."""
    actions = []
    for name in sorted(actions_config or {}):
        entry = dict(actions_config[name])
        field = f"config.actions.{name}"
        if "action" not in entry:
            raise ValueError(f"{field} needs an `action`: the dotted path of an Action "
                             "class or function, e.g. action='my_actions.PrintLoss'.")
        target = import_object(entry.pop("action"), f"{field}.action")
        schedule = {k: entry.pop(k) for k in ("every", "at_end") if k in entry}
        if isinstance(target, type) and issubclass(target, Action):
            action = target(**entry)
        elif callable(target) and not isinstance(target, type):
            action = FunctionAction(target, **entry)
        else:
            raise TypeError(f"{field}.action names {target!r}: neither an Action subclass "
                            "nor a function.")
        for key, value in schedule.items():
            setattr(action, key, value)
        if not isinstance(action.every, int) or action.every < 0:
            raise ValueError(f"{field}.every={action.every!r} must be an integer >= 0 "
                             "(0: only at the end of training).")
        actions.append(action)
    return actions


def every(step, interval):
    """True at multiples of `interval`; an interval of 0 never fires."""
    return interval > 0 and step % interval == 0


def format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


