"""What the model sees and says, in TensorBoard: the first training batch of an image
task as one grid (`train/input_batch`, after augmentation and normalization, mapped
back to pixels by the Task), and a language model's sample at each evaluation
(`eval/sample`)."""

import math

import tensorflow as tf

from trainer.task import Task
from trainer.loop.action import Action

MAX_IMAGES = 64


def image_grid(images):
    """[N, H, W, C] -> one [rows * H, cols * W, C] image of the first 64, row by row."""
    images = images[:MAX_IMAGES]
    n, height, width, channels = images.shape
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    images = tf.concat([images, tf.zeros([rows * cols - n, height, width, channels],
                                         images.dtype)], axis=0)
    grid = tf.reshape(images, [rows, cols, height, width, channels])
    return tf.reshape(tf.transpose(grid, [0, 2, 1, 3, 4]), [rows * height, cols * width,
                                                            channels])


class Samples(Action):
    """Writes the input grid when training starts at step 0, a text sample after each
    evaluation (Task.display_images, Task.eval_sample). The grid's batch comes from a
    fresh train pipeline of the Task (pipeline 0), which by the Task contract yields the
    same first batch as the one training reads."""

    at_end, chief_only, kind = False, True, "eval"

    def begin(self, controller):
        trainer = controller.trainer
        shows_images = type(trainer.task).display_images is not Task.display_images
        if controller.step or not controller.is_chief or not shows_images:
            return
        context = tf.distribute.InputContext(
            num_replicas_in_sync=trainer.strategy.num_replicas_in_sync)
        features, _ = next(iter(trainer.task.build_inputs("train", context, 0)))
        images = trainer.task.display_images(features)
        if images is not None:
            controller.summaries.image("train", "input_batch", image_grid(images), 0)

    def should_run(self, controller, step, logs):
        return "eval/loss" in logs

    def __call__(self, controller, step, logs):
        trainer = controller.trainer
        with trainer.eval_weights():  # the weights the eval just scored
            text = trainer.task.eval_sample(trainer.model)
        if text is not None:
            controller.summaries.text("eval", "sample", "```\n" + text + "\n```", step)
