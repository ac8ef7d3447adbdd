"""Evaluate: one pass over the eval split."""

import sys

from trainer.loop.action import Action


class Evaluate(Action):
    """One pass over the eval split: `eval/` summaries at the step (the metrics, and the
    task's tables: Task.eval_tables) and `logs["eval/..."]`."""

    kind = "eval"

    def __init__(self, every):
        self.every = every

    def __call__(self, controller, step, logs):
        # (per-batch calls on one worker and one compiled pass on the others would not
        # match their collectives under MultiWorkerMirroredStrategy)
        results = controller.trainer.evaluate(progress=sys.stdout.isatty() and
                                              not controller.multi_worker)
        controller.summaries.scalars("eval", results, step)
        trainer = controller.trainer
        for name, table in trainer.task.eval_tables(trainer.evaluation.metrics[2:]).items():
            controller.summaries.text("eval", name, table, step)
        logs.update({f"eval/{k}": v for k, v in results.items()})
        controller.last_eval = results
