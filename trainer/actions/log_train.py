"""LogTrain: the train metrics, learning rate, loss scale and throughput at log steps."""

from absl import logging

from trainer.loop.action import Action
from trainer.loop.goodput import bottleneck, breakdown
from trainer.step.evaluation import format_metrics, with_derived_metrics
from trainer.step.optimizers import build_learning_rate


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
        shown = {m.name for m in trainer.train_metrics} | set(trainer.task.derived_metrics())
        metrics = {k: v for k, v in results.items() if k in shown}  # derived already
        eta = (trainer.train_steps - step) / max(steps_per_sec, 1e-9)
        logging.info("step %d/%d: %s | %.0f ex/s%s, %.2f steps/s, ETA %s%s", step,
                     trainer.train_steps, format_metrics(metrics), examples_per_sec, tokens,
                     steps_per_sec, format_duration(eta), f" | {bound}" if bound else "")


def train_results(trainer):
    """The train metrics since the last call, with the learning rate the last step used
    (as per-step summaries write it; the optimizer's `learning_rate` is the next
    step's), the current loss scale and the skipped steps; resets the metrics."""
    results = with_derived_metrics(trainer.task, {m.name: float(m.result())
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


def format_duration(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
