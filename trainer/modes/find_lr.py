"""--mode=find_lr: the learning-rate range test (Smith, "Cyclical Learning Rates", 2015).

From the weights training would start from (the model's initializers, or
`config.init` for fine-tuning, with `optimizer.freeze`), up to `find_lr.steps` train steps with the
learning rate growing exponentially from `find_lr.min_lr` to `find_lr.max_lr`
(the config's optimizer, batch, precision and clipping otherwise). The loss of
each step is smoothed by an exponential moving average; the sweep stops once
it passes `find_lr.diverge` times its minimum or a step is not finite. The
suggestion is the rate where the smoothed loss falls fastest against
log(rate), before its minimum: high enough to learn quickly, below where
training breaks. Writes `workdir/find_lr.json`, `find_lr.png` (with
matplotlib) and the curve in TensorBoard (`find_lr/`), prints the override;
no checkpoint of the workdir is read or written (`config.init` is read, and
its table written to `init.json`, as training would).
"""

import copy
import io
import os

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.runtime.precision import set_policy
from trainer.runtime.summaries import Summaries
from trainer.state.workdir import ChiefFiles
from trainer.step.trainer import Trainer
from trainer.task import get_task

SMOOTHING = 0.98  # the moving average's decay, as fastai and Lightning use
CHUNK = 10  # steps per compiled call between divergence checks


def check_find_lr(f):
    if not 0 < f.min_lr < f.max_lr:
        raise ValueError(f"find_lr.min_lr={f.min_lr!r} and max_lr={f.max_lr!r} must satisfy "
                         "0 < min_lr < max_lr.")
    if not isinstance(f.steps, int) or f.steps < 10:
        raise ValueError(f"find_lr.steps={f.steps!r} must be an integer >= 10.")
    if not f.diverge > 1:
        raise ValueError(f"find_lr.diverge={f.diverge!r} must be > 1 (times the lowest "
                         "smoothed loss).")


def run(config, strategy, workdir, summary):
    set_policy(config.precision, strategy)
    find_lr(config, get_task(config), strategy, workdir)


def find_lr(config, task, strategy, workdir):
    """Runs the range test; returns the report written to `workdir/find_lr.json`."""
    f = config.find_lr
    check_find_lr(f)
    config = copy.deepcopy(config)
    config.trainer.update(per_step_summaries=True, train_steps=f.steps)
    config.optimizer.update(schedule="constant", warmup_steps=0)  # the sweep is the rate
    trainer = Trainer(config, task, strategy, workdir)
    trainer.warm_start()  # config.init: the weights training would start from
    growth = (f.max_lr / f.min_lr) ** (1.0 / (f.steps - 1))  # per step
    trainer.optimizer.learning_rate = lambda: f.min_lr * growth ** tf.cast(
        trainer.step, tf.float32)
    iterator = iter(trainer.distributed_dataset("train"))
    rates, losses, smoothed, average = [], [], [], 0.0
    stopped = f"all {f.steps} steps"
    while len(rates) < f.steps and stopped.startswith("all"):
        out = trainer.train_loop(iterator, tf.constant(min(CHUNK, f.steps - len(rates)),
                                                       tf.int64))
        for loss, rate, _, _ in out["per_step"].numpy():
            if not np.isfinite(loss):
                stopped = f"a non-finite loss at learning rate {rate:.3g}"
                break
            rates.append(float(rate))
            losses.append(float(loss))
            average = SMOOTHING * average + (1 - SMOOTHING) * loss
            smoothed.append(float(average / (1 - SMOOTHING ** len(losses))))
            if smoothed[-1] > f.diverge * min(smoothed):
                stopped = (f"the smoothed loss passed {f.diverge:g}x its minimum at "
                           f"learning rate {rate:.3g}")
                break
        if int(trainer.nonfinite_streak.numpy()) >= trainer.max_nonfinite_steps:
            stopped = "non-finite steps"
    report = {"learning_rates": rates, "losses": losses, "smoothed_losses": smoothed,
              "stopped": stopped, **suggest(rates, smoothed)}
    _write(report, workdir, trainer)
    return report


def suggest(rates, smoothed):
    """{"suggestion": the rate of the steepest descent of `smoothed` against log(rate)
    before its minimum (the first tenth skipped: the average is still settling),
    "lowest_loss_lr"}; None for both without enough points."""
    if len(smoothed) < 5:
        return {"suggestion": None, "lowest_loss_lr": None}
    lowest = int(np.argmin(smoothed))
    skip = max(len(smoothed) // 10, 1)
    window = np.array(smoothed[skip:lowest + 1])
    if len(window) < 3:  # the minimum comes before the average settles
        return {"suggestion": None, "lowest_loss_lr": rates[lowest]}
    steepest = skip + int(np.argmin(np.gradient(window, np.log(rates[skip:lowest + 1]))))
    return {"suggestion": rates[steepest], "lowest_loss_lr": rates[lowest]}


def _write(report, workdir, trainer):
    files = ChiefFiles(trainer.is_chief)
    path = os.path.join(workdir, "find_lr.json")
    files.write_json(path, report)
    summaries = Summaries(workdir, trainer.is_chief)
    for step, (rate, loss, smooth) in enumerate(zip(
            report["learning_rates"], report["losses"], report["smoothed_losses"]), 1):
        summaries.scalars("find_lr", {"learning_rate": rate, "loss": loss,
                                      "smoothed_loss": smooth}, step)
    png = _plot(report)
    if png and trainer.is_chief:
        with tf.io.gfile.GFile(os.path.join(workdir, "find_lr.png"), "wb") as out:
            out.write(png)
        image = tf.image.convert_image_dtype(tf.image.decode_png(png, channels=3), tf.float32)
        summaries.image("find_lr", "loss_vs_learning_rate", image, len(report["losses"]))
    summaries.flush()
    suggestion = report["suggestion"]
    logging.info("find_lr: %d steps, stopped by %s. Wrote %s%s.", len(report["losses"]),
                 report["stopped"], path, " and find_lr.png" if png else
                 " (pip install matplotlib for the plot)")
    if suggestion is None:
        print("find_lr: no suggestion: the loss did not fall before it diverged. Lower "
              "--config.find_lr.min_lr (or look at find_lr.json).")
    else:
        print(f"find_lr: the loss falls fastest at {suggestion:.3g} (lowest at "
              f"{report['lowest_loss_lr']:.3g}). Use:\n"
              f"  --config.optimizer.learning_rate={suggestion:.3g}")


def _plot(report):
    """The loss against the learning rate (log scale) as PNG bytes, or None without
    matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(report["learning_rates"], report["losses"], alpha=0.4, label="loss")
    ax.plot(report["learning_rates"], report["smoothed_losses"], label="smoothed")
    if report["suggestion"]:
        ax.axvline(report["suggestion"], color="red", linestyle="--",
                   label=f"suggested {report['suggestion']:.3g}")
    ax.set(xscale="log", xlabel="learning rate", ylabel="train loss",
           title="learning-rate range test")
    ax.legend()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
