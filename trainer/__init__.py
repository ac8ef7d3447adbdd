"""The training engine: Trainer, loss scaling, strategy and precision setup."""

from trainer.runtime.precision import check_keras_backend

check_keras_backend()

from trainer.loop.action import Action  # noqa: E402
from trainer.step.trainer import Trainer  # noqa: E402

__all__ = ["Action", "Trainer"]
