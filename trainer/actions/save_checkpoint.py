"""SaveCheckpoint: the training checkpoints, at intervals and whenever the run stops."""

from trainer.loop.action import Action


class SaveCheckpoint(Action):
    """Saves `workdir/checkpoints/ckpt-<step>`, also when the run stops early (a signal,
    the time budget, early stopping). Every worker calls it: a save holds collectives."""

    on_interrupt = True
    kind = "checkpoint"

    def __init__(self, every):
        self.every = every

    def __call__(self, controller, step, logs):
        controller.trainer.checkpoints.save()
