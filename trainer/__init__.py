"""The training engine: Trainer, loss scaling, strategy and precision setup.

`Trainer` and `Action` are imported when first named, so a process that needs only a
light module (a worker of a text prepare: trainer.data) does not import TensorFlow.
"""

__all__ = ["Action", "Trainer"]


def __getattr__(name):
    if name == "Trainer":
        from trainer.step.trainer import Trainer
        return Trainer
    if name == "Action":
        from trainer.loop.action import Action
        return Action
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
