"""`trainer.profile_steps = (first, last)`: a `tf.profiler` trace of exactly those train
steps, in `workdir/train/plugins/profile/` (TensorBoard's Profile tab, with the
`tensorboard-plugin-profile` package: `pip install -e '.[profile]'`).

The Controller ends a compiled chunk at step first - 1 and at step last, so the
trace holds those steps and no other; each host call of the train loop is marked
as a profiler step ("train", step_num = its first step), which the Profile
tab's step-time view reads.
"""

import os

import tensorflow as tf
from absl import logging

from trainer.loop.action import Action


def check_profile_steps(profile_steps, train_steps):
    """Returns (first, last) or None; a clear error for anything else."""
    if not profile_steps:
        return None
    steps = tuple(profile_steps)
    if (len(steps) != 2 or not all(isinstance(s, int) and not isinstance(s, bool)
                                   for s in steps) or not 1 <= steps[0] <= steps[1]):
        raise ValueError(f"trainer.profile_steps={profile_steps!r} must be (first, last) with "
                         "1 <= first <= last, e.g. --config.trainer.profile_steps='(10, 15)'; "
                         "() for no profile.")
    if steps[1] > train_steps:
        raise ValueError(f"trainer.profile_steps={steps} ends after trainer.train_steps="
                         f"{train_steps}.")
    return steps


class Profile(Action):
    """Starts the profiler after step first - 1 and stops it after step `last`. It runs
    first among the actions, so the trace ends with step `last`'s compiled call (the
    actions due at step first - 1, if any, are in it)."""

    at_end, on_interrupt, chief_only = False, True, True

    def __init__(self, first, last, logdir):
        self.first, self.last, self.logdir = first, last, logdir
        self.active = False

    def begin(self, controller):
        if controller.is_chief and self.first - 1 <= controller.step < self.last:
            # from the start, or resumed inside the window
            self(controller, controller.step, {})

    def boundaries(self):
        return (self.first - 1, self.last)

    def end(self, controller):
        """A run that raised inside the window: stop, so that the process (a test, a
        notebook, a relaunch in the same process) can profile again."""
        if self.active:
            tf.profiler.experimental.stop()
            self.active = False

    def should_run(self, controller, step, logs):
        return step in self.boundaries() or (self.active and (
            controller.done or controller.interrupted is not None))

    def __call__(self, controller, step, logs):
        if not self.active and self.first - 1 <= step < self.last and not (
                controller.done or controller.interrupted):
            tf.profiler.experimental.start(self.logdir)
            self.active = True
            logging.info("Profiling steps %d to %d.", step + 1, self.last)
        elif self.active:
            tf.profiler.experimental.stop()
            self.active = False
            logging.info("Profile of steps %d to %d in %s.", self.first, step,
                         os.path.join(self.logdir, "plugins", "profile"))
