"""--mode=continuous_eval: a process of its own evaluates each checkpoint of a run once.

It reads `workdir/checkpoints` and writes only `eval/` summaries at each
checkpoint's step, the best checkpoint (`best/`) and `continuous_eval.json`
(the last step evaluated, so a restarted evaluator does not repeat one); it
never writes a training checkpoint, so it does not take the training run's
lock. Run the training job with `--mode=train`: it then spends no time on
evaluation.
"""

import os
import time

import tensorflow as tf
from absl import logging

from trainer.actions import Evaluate, best_checkpoint
from trainer.loop.controller import Controller
from trainer.runtime.precision import set_policy
from trainer.runtime.settings import check_number
from trainer.state.checkpoint_state import latest_checkpoint, listed_checkpoints, number
from trainer.state.workdir import read_json
from trainer.step.trainer import Trainer
from trainer.task import get_task

STATE = "continuous_eval.json"
POLL_SECONDS = 1.0  # as tf.train.checkpoints_iterator


def run(config, strategy, workdir, summary):
    set_policy(config.precision, strategy)
    trainer = Trainer(config, get_task(config), strategy, workdir)
    check(trainer)
    evaluate, best = Evaluate(0), best_checkpoint(trainer)
    loop = Controller(trainer, [a for a in (evaluate, best) if a])
    continuous_eval(loop, evaluate, best, summary)


def check(trainer):
    """Fails on a run config a continuous evaluator cannot serve, naming the fix."""
    check_number(trainer.config.eval.timeout_seconds, "eval.timeout_seconds", "seconds "
                 "--mode=continuous_eval waits for a new checkpoint before it ends",
                 positive=True)
    if trainer.config.trainer.early_stop_patience:
        raise ValueError(
            "--mode=continuous_eval cannot stop the training run, so early stopping needs "
            "--mode=train_and_eval; set --config.trainer.early_stop_patience=0.")
    if isinstance(trainer.strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # Each worker would poll the directory on its own clock and could pick other
        # checkpoints, while every evaluation holds collectives.
        raise ValueError("--mode=continuous_eval runs in one process: set "
                         "--config.distribution.strategy to mirrored, one_device or default.")


def continuous_eval(controller, evaluate, best, summary):
    """Evaluates every checkpoint newer than the last one evaluated, in step order,
    with the `evaluate` and `best` (or None) actions of `controller`; returns once
    the training run's final checkpoint is evaluated, or after
    `config.eval.timeout_seconds` without a new one. `summary` (a dict) gets the
    steps evaluated, the last results and why it ended."""
    summary.update(evaluated_steps=[], eval=None)
    trainer = controller.trainer
    config = trainer.config
    if best:
        best.begin(controller)
    state_path = os.path.join(trainer.workdir, STATE)
    state = read_json(state_path, "the continuous evaluator's progress")
    last = state["last_evaluated_step"] if state else -1
    directory = trainer.checkpoints.directory
    timeout = config.eval.timeout_seconds
    summary["last_evaluated_step"] = last
    if last >= _final_step(trainer):
        summary["ended"] = "the final checkpoint was evaluated already"
        logging.info("The final checkpoint (step %d) was evaluated already: done.", last)
        return None
    logging.info("Watching %s for checkpoints (%s; gives up after %s s without a new one).",
                 directory, f"evaluated up to step {last}" if last >= 0 else "none evaluated yet",
                 timeout)
    for _ in _new_checkpoints(directory, timeout):
        for step, path in _checkpoints_after(directory, last):
            try:
                trainer.restore(path)
            except RuntimeError:  # unreadable, or rotated away by max_to_keep meanwhile
                logging.warning("Skipping checkpoint %s: it can no longer be read.", path)
                continue
            controller.step = step
            logs = {}
            evaluate(controller, step, logs)
            if best:
                best(controller, step, logs)
            controller.summaries.flush()
            last = step
            controller.files.write_json(state_path, {"last_evaluated_step": step})
            summary["evaluated_steps"].append(step)
            summary.update(last_evaluated_step=step, eval=controller.last_eval)
            if step >= _final_step(trainer):
                summary["ended"] = "evaluated the final checkpoint"
                logging.info("Evaluated the final checkpoint (step %d): done.", step)
                return controller.last_eval
    summary["ended"] = f"no new checkpoint for {timeout} s"
    logging.info("No new checkpoint in %s for %s s: done (last evaluated: step %d).",
                 directory, timeout, last)
    return controller.last_eval


def _new_checkpoints(directory, timeout):
    """Yields each time the newest checkpoint of `directory` changes, listed as a restore
    lists them (tf.train.checkpoints_iterator reads only the state file, which a damage
    would leave silent); returns after `timeout` seconds without a change."""
    seen, deadline = None, time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = latest_checkpoint(directory)
        if latest != seen:
            seen = latest
            yield latest
            deadline = time.monotonic() + timeout
        else:
            time.sleep(POLL_SECONDS)


def _final_step(trainer):
    """train_steps of the training run (its config.json, which a relaunch with more steps
    updates), else of this process's config."""
    written = read_json(os.path.join(trainer.workdir, "config.json"), "the run's config")
    return written["trainer"]["train_steps"] if written else trainer.train_steps


def _checkpoints_after(directory, last_step):
    """(step, path) of the checkpoints in `directory` newer than `last_step`, oldest first."""
    return [(number(p), p) for p in listed_checkpoints(directory) if number(p) > last_step]
