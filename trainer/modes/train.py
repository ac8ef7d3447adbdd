"""--mode=train and --mode=train_and_eval: train to trainer.train_steps from wherever the
workdir left off, with the built-in actions (trainer/actions/) and the config's."""

from trainer.actions import train_actions
from trainer.loop.controller import Controller
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
    last eval results."""
    return controller(trainer, evaluate, actions).train()


def controller(trainer, evaluate=True, actions=()):
    """The Controller of a training run, with `train_actions`."""
    return Controller(trainer, train_actions(trainer, evaluate, actions))
