"""The training engine: Trainer, loss scaling, strategy and precision setup."""

from trainer.precision import check_keras_backend

check_keras_backend()

from trainer.trainer import Trainer  # noqa: E402

__all__ = ["Trainer"]
