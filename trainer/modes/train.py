"""--mode=train and --mode=train_and_eval: train to trainer.train_steps from wherever the
workdir left off, with the built-in actions (trainer/actions/) and the config's."""

from absl import logging

from trainer.actions import train_actions
from trainer.actions.start_state import StartState
from trainer.loop.controller import Controller
from trainer.loop.diagnosis import diagnose
from trainer.loop.diagnosis_report import summary_line
from trainer.loop.divergence import Diverged
from trainer.loop.run_summary import restate_stopped
from trainer.runtime.precision import set_policy
from trainer.state.workdir import check_outside_data
from trainer.step.trainer import Trainer
from trainer.task import get_task


def run(config, strategy, workdir, summary, evaluate):
    """Trains (training writes its own summary.json; `summary` is unused)."""
    set_policy(config.precision, strategy)
    task = get_task(config)
    check_outside_data(workdir, task.data_paths())
    task.prepare_data()  # once for many runs; a no-op when it is ready (--mode=prepare)
    train(Trainer(config, task, strategy, workdir), evaluate)


def train(trainer, evaluate=True, actions=()):
    """Trains `trainer` with the actions the config asks for and `actions`; returns the
    last eval results. A divergence is diagnosed (`trainer.diagnose`) before it is
    raised again, with the diagnosis as its remedy."""
    control = controller(trainer, evaluate, actions)
    start = next((a for a in control.actions if isinstance(a, StartState)), None)
    try:
        return control.train()
    except Diverged as diverged:
        if not trainer.config.trainer.diagnose:
            raise
        raise _diagnosed(control, diverged, start.path if start else None) from diverged
    finally:
        if start:
            start.release()


def _diagnosed(control, diverged, start_state):
    """`diverged`, its remedies replaced by the diagnosis (also in summary.json)."""
    try:
        line = summary_line(diagnose(control, diverged, start_state))
    except Exception as error:  # noqa: BLE001  (the divergence is the news, not this)
        logging.exception("The diagnosis of the divergence failed: %s", error)
        return diverged
    told = Diverged(diverged.facts, line, diverged.step, diverged.streak,
                    diverged.weights_finite)
    restate_stopped(control, f"{type(told).__name__}: {told}")
    return told


def controller(trainer, evaluate=True, actions=()):
    """The Controller of a training run, with `train_actions`."""
    return Controller(trainer, train_actions(trainer, evaluate, actions))
