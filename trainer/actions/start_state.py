"""StartState: a copy in host memory of the state a run starts from at step 0, until its
first checkpoint, so that a run that diverges before any checkpoint can still be
replayed by the diagnosis (trainer/loop/diagnosis.py). Nothing is written to disk."""

import os

import tensorflow as tf

from trainer.loop.action import Action


class StartState(Action):
    """`path`: the in-memory (`ram://`) checkpoint of the step-0 state, or None."""

    at_end = False

    def __init__(self, checkpoint_every):
        self.every = checkpoint_every  # frees the copy once a checkpoint stands for it
        self.path = None

    def begin(self, controller):
        trainer = controller.trainer
        if int(trainer.step.numpy()) == 0:
            # One process's memory: every worker keeps its own copy (TensorFlow's `ram://`
            # filesystem; the checkpoint object is the one every save writes).
            self.path = trainer.checkpoints.checkpoint.write(
                f"ram://tftrainer/{os.getpid()}-{id(self)}/start")

    def __call__(self, controller, step, logs):
        # A checkpoint saved amid non-finite steps (fewer than max_nonfinite_steps) is no
        # good state to replay from: the copy stays until a finite step's checkpoint.
        trainer = controller.trainer
        if self.path and trainer.checkpoints.saved_step == step and \
                int(trainer.nonfinite_streak.numpy()) == 0:
            self.release()

    def end(self, controller):
        if controller.done:  # trained to the end: no diagnosis will read it
            self.release()

    def release(self):
        """Frees the copy."""
        if self.path:
            tf.io.gfile.rmtree(os.path.dirname(self.path))
            self.path = None
