"""One place assembles a run, one function per mode, each reading top to bottom:

    precision and task -> Trainer (model, optimizer, compiled step, checkpoints)
        -> the actions the config asks for -> Controller (only runs the loop)

`trainer/cli.py` builds the strategy, locks the workdir and calls `run`. A
mode builds what it needs and nothing else: evaluation has no logging or
export action, export builds no Trainer.
"""

import os
import sys

import tensorflow as tf
from absl import logging

import tasks
from trainer.loop import actions as actions_lib
from trainer.loop.consistency import consistency_check
from trainer.loop.controller import Controller
from trainer.loop.jit_choice import JitChoice
from trainer.loop.run_summary import mode_summary
from trainer.modes import evaluator
from trainer.modes.batch_size_finder import find_batch_size
from trainer.modes.lr_finder import find_lr
from trainer.modes.precision_check import precision_check
from trainer.outputs.best import BestCheckpoint
from trainer.outputs.export import Export, check_export, choose_checkpoint, export
from trainer.outputs.numerics import NumericsLog
from trainer.outputs.profiler import Profile, check_profile_steps
from trainer.outputs.samples import Samples
from trainer.runtime.distribute import is_chief
from trainer.runtime.precision import layers_of, set_policy, use_float32_layers
from trainer.state.workdir import ChiefFiles, check_outside_data
from trainer.step.trainer import Trainer

MODES = ("train", "eval", "train_and_eval", "continuous_eval", "sample", "precision_check",
         "export", "find_lr", "find_batch_size")


def run(config, strategy, workdir, mode):
    """Runs `mode` with `strategy` on `workdir`; eval, continuous_eval and export
    write `summary_<mode>.json`, training writes `summary.json` itself. An error raised
    while reading the input is told as the task explains it (the file that broke it)."""
    try:
        _run_mode(config, strategy, workdir, mode)
    except tf.errors.OpError as error:
        explained = tasks.get_task(config).explain_input_error(error)
        if explained is None:
            raise
        raise explained from error


def _run_mode(config, strategy, workdir, mode):
    if mode not in ("train", "train_and_eval") and config.data.get("service"):
        # The finders and the precision check compare runs on the same batches, which
        # the service's delivery order would not give.
        logging.info("data.service=%s is for training: --mode=%s reads its input itself.",
                     config.data.service, mode)
        config.data.service = ""
    if mode == "precision_check":
        precision_check(config, strategy, workdir, tasks.get_task)
        return
    if mode == "find_batch_size":
        set_policy(config.precision, strategy)
        find_batch_size(config, strategy, workdir, tasks.get_task)
        return
    if mode not in ("eval", "continuous_eval", "export"):
        _run(config, strategy, workdir, mode, {})
        return
    with mode_summary(workdir, mode, ChiefFiles(is_chief(strategy))) as summary:
        _run(config, strategy, workdir, mode, summary)


def _run(config, strategy, workdir, mode, summary):
    set_policy(config.precision, strategy)
    task = tasks.get_task(config)
    if mode in ("train", "train_and_eval"):
        check_outside_data(workdir, task.data_paths())
    if mode == "export":
        run_export(config, task, strategy, workdir, summary)
        return
    if mode == "find_lr":
        find_lr(config, task, strategy, workdir)
        return
    trainer = Trainer(config, task, strategy, workdir)
    if mode == "continuous_eval":
        run_continuous_eval(trainer, summary)
    elif mode == "eval":
        run_eval(trainer, summary)
    elif mode == "sample":
        run_sample(trainer)
    else:
        train(trainer, evaluate=mode == "train_and_eval")


def train(trainer, evaluate=True, actions=()):
    """Trains to `trainer.train_steps` from wherever the workdir left off, with the
    actions the config asks for and `actions`; returns the last eval results."""
    return controller(trainer, evaluate, actions).train()


def controller(trainer, evaluate=True, actions=()):
    """The Controller of a training run, with `train_actions`."""
    return Controller(trainer, train_actions(trainer, evaluate, actions))


def train_actions(trainer, evaluate=True, actions=()):
    """In their order: JitChoice (`jit_compile=auto`), Profile (`profile_steps`),
    ConsistencyCheck (`consistency_every`, and before every action that saves or
    evaluates), LogTrain (`log_every`),
    SaveCheckpoint (`checkpoint_every`, and whenever the run stops early), Evaluate
    (`eval_every`, if `evaluate`), BestCheckpoint (`best_metric`, with early stopping
    after `early_stop_patience` evaluations without improvement), Samples (input
    grid, text samples), NumericsLog (`numerics.every`), ProgressBar (stdout a
    terminal), Export (`export.enabled`, at the end); then the actions of
    `config.actions`, then `actions`."""
    config, tc = trainer.config, trainer.config.trainer
    if tc.early_stop_patience and not evaluate:
        raise ValueError(
            f"trainer.early_stop_patience={tc.early_stop_patience} needs evaluation "
            "during training (--mode=train_and_eval); set "
            "--config.trainer.early_stop_patience=0 to train without it.")
    if tc.early_stop_patience and not tc.eval_every:
        raise ValueError(
            f"trainer.early_stop_patience={tc.early_stop_patience} counts evaluations, "
            "but trainer.eval_every=0 evaluates only at the end; set "
            "--config.trainer.eval_every.")
    built = [actions_lib.LogTrain(tc.log_every), actions_lib.SaveCheckpoint(tc.checkpoint_every)]
    if evaluate:
        built.append(actions_lib.Evaluate(tc.eval_every))
        best = best_checkpoint(trainer)
        if best:
            built.append(best)
    built.append(Samples())
    if trainer.telemetry:
        built.append(NumericsLog(
            trainer.telemetry, trainer.loss_scale.enabled,
            os.path.join(trainer.workdir, "numerics.json"),
            {layer.path: layer.compute_dtype for layer in layers_of(trainer.model)}))
    if sys.stdout.isatty():
        built.append(actions_lib.ProgressBar())
    profile = check_profile_steps(tc.profile_steps, trainer.train_steps)
    if profile:
        built.insert(0, Profile(*profile, os.path.join(trainer.workdir, "train")))
    if config.export.enabled:
        check_export(config, trainer.task)  # now, not after training
        built.append(Export())
    built += actions_lib.from_config(config.actions) + list(actions)
    check = consistency_check(trainer, built)  # before every action that saves or evaluates
    if check:
        built.insert(1 if profile else 0, check)  # (the profiler stays first)
    if trainer.jit_compile == "auto":
        built.insert(0, JitChoice())  # settles it before the first step's trace
    return built


def best_checkpoint(trainer):
    """The BestCheckpoint action `config.trainer` asks for, or None."""
    tc = trainer.config.trainer
    if not tc.best_metric:
        return None
    known = [f"eval/{name}" for name in trainer.evaluation.names]
    if tc.best_metric not in known:
        raise ValueError(f"trainer.best_metric={tc.best_metric!r} is not an eval metric "
                         f"of this task; choose one of {', '.join(known)}.")
    return BestCheckpoint(os.path.join(trainer.workdir, "best"), tc.best_metric,
                          tc.best_mode, tc.early_stop_patience)


def run_eval(trainer, summary):
    """--mode=eval: the latest checkpoint, once, written to `eval/`."""
    summary["checkpoint"] = _restore_for("eval", trainer)
    evaluate = actions_lib.Evaluate(0)
    loop = Controller(trainer, [evaluate])
    evaluate(loop, loop.step, {})
    loop.summaries.flush()
    summary.update(step=loop.step, eval=loop.last_eval)


def run_continuous_eval(trainer, summary):
    """--mode=continuous_eval: each new checkpoint once, and the best of them."""
    evaluator.check(trainer)
    evaluate, best = actions_lib.Evaluate(0), best_checkpoint(trainer)
    loop = Controller(trainer, [a for a in (evaluate, best) if a])
    return evaluator.continuous_eval(loop, evaluate, best, summary)


def run_sample(trainer):
    """--mode=sample: text from the latest checkpoint, to stdout."""
    task, s = trainer.task, trainer.config.sample
    if not hasattr(task, "sample"):
        raise ValueError(f"--mode=sample: task {trainer.config.task.name!r} cannot generate "
                         "text.")
    _restore_for("sample", trainer)
    prompt = s.prompt.encode()
    with trainer.eval_weights():  # the EMA weights, if evaluation uses them
        text = task.sample(trainer.model, prompt, s.num_bytes, s.temperature, s.top_k, s.seed)
    # The bytes as sampled (a decode would replace a cut UTF-8 sequence).
    sys.stdout.buffer.write(prompt + text + b"\n")
    sys.stdout.flush()


def run_export(config, task, strategy, workdir, summary):
    """--mode=export: a SavedModel of the checkpoint `choose_checkpoint` picks."""
    use_float32_layers(tuple(config.precision_overrides.float32_layers))
    if is_chief(strategy):  # one writer
        summary["checkpoint"] = choose_checkpoint(config, workdir)
        summary["directory"] = export(config, task, workdir, summary["checkpoint"])


def _restore_for(mode, trainer):
    path = trainer.restore()
    if not path:
        raise FileNotFoundError(
            f"--mode={mode}: no checkpoint in {trainer.workdir}/checkpoints. Train "
            "first (--mode=train_and_eval) or point --workdir at a trained run.")
    return path
