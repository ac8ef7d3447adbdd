"""The built-in actions, one per module, and the one place that states their order.

Each is an `Action` (trainer/loop/action.py) like the ones a user writes; the
Controller calls the due ones in the order of `train_actions`.
"""

import os
import sys

from trainer.actions.best_checkpoint import BestCheckpoint
from trainer.actions.consistency_check import consistency_check
from trainer.actions.debug_dump import DebugDump
from trainer.actions.evaluate import Evaluate
from trainer.actions.export import Export, check_export
from trainer.actions.jit_choice import JitChoice
from trainer.actions.log_train import LogTrain
from trainer.actions.numerics_log import NumericsLog
from trainer.actions.profile import Profile, check_profile_steps
from trainer.actions.progress_bar import ProgressBar
from trainer.actions.samples import Samples
from trainer.actions.save_checkpoint import SaveCheckpoint
from trainer.actions.start_state import StartState
from trainer.loop.action import from_config
from trainer.runtime.distribute import worker_index
from trainer.runtime.precision import layers_of


def train_actions(trainer, evaluate=True, extra=()):
    """A training run's actions, in the order they run at a step:

    JitChoice (`jit_compile=auto`: settles XLA before the first step's trace), Profile
    (`profile_steps`), DebugDump (`debug=dump`), ConsistencyCheck (`consistency_every`,
    and before every action that saves or evaluates), LogTrain (`log_every`),
    SaveCheckpoint (`checkpoint_every`, and whenever the run stops early), StartState
    (`diagnose`: the step-0 state in memory until a checkpoint), Evaluate
    (`eval_every`, if `evaluate`), BestCheckpoint (`best_metric`, with early stopping),
    Samples (input grid, text samples), NumericsLog (`numerics.every`), ProgressBar
    (stdout a terminal), Export (`export.enabled`, at the end); then the actions of
    `config.actions`, then `extra`."""
    config, tc = trainer.config, trainer.config.trainer
    _check_early_stopping(tc, evaluate)
    best = best_checkpoint(trainer) if evaluate else None
    profile = check_profile_steps(tc.profile_steps, trainer.train_steps)
    if config.export.enabled:
        check_export(config, trainer.task)  # now, not after training
    first = [JitChoice() if trainer.jit_compile == "auto" else None,
             Profile(*profile, os.path.join(trainer.workdir, "train")) if profile else None,
             DebugDump(*tc.debug_steps, trainer.workdir, worker_index(trainer.strategy))
             if tc.debug == "dump" else None]
    rest = [LogTrain(tc.log_every),
            SaveCheckpoint(tc.checkpoint_every),
            StartState(tc.checkpoint_every) if tc.diagnose else None,
            Evaluate(tc.eval_every) if evaluate else None,
            best,
            Samples(),
            NumericsLog(trainer.telemetry, trainer.loss_scale.enabled,
                        os.path.join(trainer.workdir, "numerics.json"),
                        {layer.path: layer.compute_dtype for layer in layers_of(trainer.model)})
            if trainer.telemetry else None,
            ProgressBar() if sys.stdout.isatty() else None,
            Export() if config.export.enabled else None,
            *from_config(config.actions), *extra]
    rest = [a for a in rest if a]
    return [a for a in first + [consistency_check(trainer, rest)] + rest if a]


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


def _check_early_stopping(tc, evaluate):
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


__all__ = ["BestCheckpoint", "DebugDump", "Evaluate", "Export", "JitChoice", "LogTrain",
           "NumericsLog", "Profile", "ProgressBar", "Samples", "SaveCheckpoint", "StartState",
           "best_checkpoint", "train_actions"]
