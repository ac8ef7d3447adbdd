"""--mode=eval: the latest checkpoint, evaluated once, written to `eval/`."""

from trainer.actions import Evaluate
from trainer.loop.controller import Controller
from trainer.loop.run_summary import check_task_record
from trainer.runtime.precision import set_policy
from trainer.step.trainer import Trainer
from trainer.task import get_task


def run(config, strategy, workdir, summary):
    set_policy(config.precision, strategy)
    trainer = Trainer(config, get_task(config), strategy, workdir)
    summary["checkpoint"] = restore_latest(trainer, "eval")
    check_task_record(workdir, trainer.task.run_record(), summary["checkpoint"])
    evaluate = Evaluate(0)
    loop = Controller(trainer, [evaluate])
    evaluate(loop, loop.step, {})
    loop.summaries.flush()
    summary.update(step=loop.step, eval=loop.last_eval)


def restore_latest(trainer, mode):
    """Restores the latest checkpoint for a mode that reads a trained run; its path."""
    path = trainer.restore()
    if not path:
        raise FileNotFoundError(
            f"--mode={mode}: no checkpoint in {trainer.workdir}/checkpoints. Train "
            "first (--mode=train_and_eval) or point --workdir at a trained run.")
    return path
