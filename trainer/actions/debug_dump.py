"""DebugDump (`trainer.debug=dump`): TensorFlow Debugger V2 data of the train steps
`trainer.debug_steps` = (first, last), in workdir/debug/<launch time>-worker<i>/, for
TensorBoard's Debugger V2 tab (docs/precision.md#debug-modes).

The dump instruments the graphs traced while it is on, so the train loop is traced
again when it starts and when it ends; compiled chunks end at both steps. One directory
per launch and worker: Debugger V2 reads one run per directory.
"""

import os
import time

import tensorflow as tf
from absl import logging

from trainer.loop.action import Action
from trainer.runtime.debug import DUMP_DIR, TENSOR_DEBUG_MODE


class DebugDump(Action):

    at_end = False

    def __init__(self, first, last, workdir, worker=0):
        self.first, self.last = first, last
        self.directory = os.path.join(workdir, DUMP_DIR,
                                      f"{time.strftime('%Y%m%d-%H%M%S')}-worker{worker}")
        self.dumping = False

    def boundaries(self):
        return (self.first - 1, self.last)

    def begin(self, controller):
        if controller.step >= self.last:
            logging.warning("trainer.debug=dump: this run starts at step %d, after "
                            "trainer.debug_steps=(%d, %d): nothing is dumped.",
                            controller.step, self.first, self.last)
        self._switch(controller)

    def should_run(self, controller, step, logs):
        return step in self.boundaries()

    def __call__(self, controller, step, logs):
        self._switch(controller)

    def end(self, controller):
        if self.dumping:
            self._stop(controller)

    def _switch(self, controller):
        """On for the steps first..last: the next chunk starts at controller.step + 1."""
        wanted = self.first - 1 <= controller.step < self.last
        if wanted and not self.dumping:
            tf.debugging.experimental.enable_dump_debug_info(
                self.directory, tensor_debug_mode=TENSOR_DEBUG_MODE, circular_buffer_size=-1)
            self.dumping = True
            controller.trainer.use_jit(False)  # traced again, instrumented
            logging.info("trainer.debug=dump: Debugger V2 data of steps %d to %d in %s; "
                         "open it with tensorboard --logdir=%s (Debugger V2 tab).",
                         self.first, self.last, self.directory, self.directory)
        elif not wanted and self.dumping:
            self._stop(controller)

    def _stop(self, controller):
        tf.debugging.experimental.disable_dump_debug_info()
        self.dumping = False
        controller.trainer.use_jit(False)  # traced again, without the instrumentation
