"""What a run records of itself: at its start `config.json`, the config in
TensorBoard (text and HParams); at its end, for any reason (train_steps reached,
early stop, time budget, signal, divergence, a failure), `summary.json`. The
other modes write `summary_<mode>.json` beside it (`mode_summary`), so an
evaluation or an export never replaces the training run's summary."""

import contextlib
import importlib.metadata
import json
import math
import os
import platform
import time

import keras
import tensorflow as tf
from absl import logging

from trainer.loop import goodput
from trainer.state.workdir import is_local, read_json
from trainer.step.accumulation import warn_if_the_stream_moves
from trainer.step.warm_start import TASK_RECORD


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def write_start(controller):
    """Writes the config (after checking it against the previous run's, on a resume) and
    the task's record (refusing a resume whose data it does not match)."""
    trainer = controller.trainer
    record = trainer.task.run_record()
    if record is not None:
        _write_task_record(controller, json.loads(json.dumps(record)))
    path = os.path.join(trainer.workdir, "config.json")
    warn_if_the_stream_moves(read_json(path, "the config of the previous run"),
                             trainer.config, controller.step)
    controller.files.write_text(path, trainer.config.to_json_best_effort(indent=2))
    controller.summaries.text("train", "config", "```\n" + str(trainer.config) + "\n```",
                              controller.step)
    controller.summaries.hparams(trainer.config)
    parent = os.path.dirname(os.path.abspath(trainer.workdir) if is_local(trainer.workdir)
                             else trainer.workdir.rstrip("/"))
    logging.info("TensorBoard logs in %s; view with: tensorboard --logdir=%s",
                 trainer.workdir, parent)


def _write_task_record(controller, record):
    if controller.step:
        check_task_record(controller.trainer.workdir, record,
                          f"The checkpoint at step {controller.step}")
    controller.files.write_json(os.path.join(controller.trainer.workdir, TASK_RECORD), record)


def check_task_record(workdir, record, what):
    """Refuses to go on from `what` (a checkpoint of the run in `workdir`) with data whose
    Task.run_record differs from the one the run wrote (`record`, None: no record)."""
    if record is None:
        return
    record = json.loads(json.dumps(record))
    path = os.path.join(workdir, TASK_RECORD)
    previous = read_json(path, "the task's record of the run")
    if previous is not None and previous != record:
        changed = sorted(k for k in set(record) | set(previous)
                         if record.get(k) != previous.get(k))
        raise ValueError(
            f"{what} was trained on data whose {', '.join(changed)} differ from this "
            f"launch's ({path} holds the run's): was "
            f"{json.dumps({k: previous.get(k) for k in changed})[:300]}, now "
            f"{json.dumps({k: record.get(k) for k in changed})[:300]}. Use the data it was "
            "trained on, or start a new workdir (init.checkpoint can start from this one). "
            "Nothing was changed.")


def run_summary(controller, stopped):
    """The summary of `controller`'s run; `stopped`: why it ended early, or None."""
    trainer = controller.trainer
    seconds = dict(controller.seconds, total=controller.clock() - controller.started)
    steps_this_run = controller.step - controller.start_step
    model = trainer.model
    return {
        "stopped": stopped,
        "steps": controller.step,
        "train_steps": trainer.train_steps,
        "steps_this_run": steps_this_run,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "examples_per_sec": round(steps_this_run * trainer.examples_per_step
                                  / max(seconds["train"], 1e-9), 1),
        # shares of the loop's wall time: input wait, compiled step, saves, eval, host
        "time_breakdown": goodput.breakdown(controller.seconds,
                                            controller.clock() - controller.loop_started),
        # model FLOPs utilization over this run's train seconds (trainer/step/flops.py)
        "mfu": (trainer.utilization.mfu(steps_this_run / max(seconds["train"], 1e-9))
                if steps_this_run else None),
        "model_flops_per_step": trainer.utilization.flops_per_step,
        "train": controller.last_train,
        "eval": controller.last_eval,
        "precision": trainer.policy,
        "jit_compile": trainer.jit_compile,  # as settled (trainer/actions/jit_choice.py)
        "skipped_steps": int(trainer.loss_scale.skipped_steps.numpy()),
        "strategy": type(trainer.strategy).__name__,
        "replicas": trainer.strategy.num_replicas_in_sync,
        # this launch's seconds to its loop, by phase, and the FLOPs count's (the first log;
        # with the CPU peak's matmul timing when that is not cached yet)
        "startup_seconds": controller.startup,
        "flops_count_seconds": trainer.utilization.count_seconds,
        "global_batch_size": trainer.global_batch_size,
        "accumulation_steps": trainer.accumulation_steps,
        "data": trainer.task.describe_data(),
        # counted from the shapes: no copy of the weights to the host
        "parameters": {"trainable": sum(math.prod(v.shape) for v in model.trainable_weights),
                       "total": model.count_params()},
        "versions": versions(),
    }


def restate_stopped(controller, stopped):
    """Replaces `stopped` in the summary.json the run wrote as it ended (the diagnosis of
    a divergence comes after)."""
    path = os.path.join(controller.trainer.workdir, "summary.json")
    if controller.is_chief and tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as f:
            summary = json.load(f)
        controller.files.write_json(path, dict(summary, stopped=stopped))


def versions():
    return {"python": platform.python_version(), "tensorflow": tf.__version__,
            "keras": keras.__version__, "tftrainer": _version("tftrainer")}


@contextlib.contextmanager
def mode_summary(workdir, mode, files):
    """Writes `workdir/summary_<mode>.json` (through `files`, a ChiefFiles) however the
    mode ends: the dict yielded, which the mode fills, with `mode`, `seconds`,
    `versions` and `stopped` (None, or the error that ended it)."""
    started, summary, stopped = time.monotonic(), {"mode": mode}, None
    try:
        yield summary
    except BaseException as error:
        stopped = f"{type(error).__name__}: {str(error).strip()[:500]}"
        raise
    finally:
        summary.update(stopped=stopped, seconds=round(time.monotonic() - started, 2),
                       versions=versions())
        try:
            files.write_json(os.path.join(workdir, f"summary_{mode}.json"), summary)
        except Exception as write_error:  # noqa: BLE001  (the mode's own error matters more)
            logging.error("summary_%s.json not written: %s", mode, write_error)


def write_summary(controller, stopped):
    """Logs the summary and writes it (chief only) to `workdir/summary.json`, with the
    goodput of every launch so far (also in TensorBoard and as a table)."""
    summary = run_summary(controller, stopped)
    controller.ledger.end(controller.step, stopped)
    if controller.is_chief:
        summary["goodput"] = report = goodput.account(controller.ledger.read())
        if report:
            goodput.log_table(report)
            controller.summaries.scalars("train", dict(
                {"goodput/goodput": report["goodput"] or 0.0,
                 "goodput/productive_seconds": report["productive_seconds"]},
                **{f"goodput/{k}_seconds": v for k, v in report["badput_seconds"].items()}),
                controller.step)
            controller.summaries.flush()
    controller.files.write_json(os.path.join(controller.trainer.workdir, "summary.json"),
                                summary)
    logging.info("Done: %s", json.dumps({k: summary[k] for k in (
        "steps", "steps_this_run", "seconds", "precision", "skipped_steps", "stopped",
        "data", "eval")}))
    if "SYNTHETIC" in summary["data"]:
        logging.warning("This run used SYNTHETIC data, not the real dataset.")
    return summary
