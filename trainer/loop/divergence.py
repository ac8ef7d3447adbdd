"""The divergence check between compiled chunks: a run whose steps keep being
non-finite, or whose weights are, stops before anything is saved."""

import tensorflow as tf

from trainer.step.loss_scale import all_finite


class Diverged(FloatingPointError):
    """A run stopped for divergence at `step`: `streak` non-finite steps in a row, and
    whether the weights were still finite (trainer/loop/diagnosis.py replays it)."""

    def __init__(self, facts, remedies, step, streak, weights_finite):
        super().__init__(f"{facts} {remedies}")
        self.facts, self.remedies = facts, remedies
        self.step, self.streak, self.weights_finite = step, streak, weights_finite


def check_finite(trainer, step):
    """Raises Diverged, naming the last good checkpoint and what to try, if
    `trainer` has diverged."""
    streak = int(trainer.nonfinite_streak.numpy())
    weights_finite = bool(all_finite([w for w in trainer.model.weights
                                      if tf.as_dtype(w.dtype).is_floating]))
    if streak < trainer.max_nonfinite_steps and weights_finite:
        return
    latest = trainer.checkpoints.latest if trainer.is_chief else None
    what = (f"{streak} consecutive steps had non-finite gradients (skipped, so the "
            "weights were not changed by them)" if weights_finite
            else "the weights became non-finite")
    raise Diverged(
        f"Training diverged at step {step}: {what}. Mean train loss since the last log: "
        f"{float(trainer.train_metrics[0].result()):.4g}; loss scale "
        f"{float(trainer.loss_scale.scale.numpy()):g}. No checkpoint was written; the last "
        f"good one is kept: {latest or 'none yet'}.",
        "Try a lower --config.optimizer.learning_rate, --config.optimizer.clip_norm=1.0, "
        "float32 or mixed_bfloat16 instead of mixed_float16, or a larger "
        f"--config.trainer.max_nonfinite_steps (now {trainer.max_nonfinite_steps}).",
        step, streak, weights_finite)
