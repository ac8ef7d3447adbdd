"""The built-in tasks; importing this package registers them (`trainer.task.register`)."""

from tasks import image_classification, lm, text_classification  # noqa: F401
