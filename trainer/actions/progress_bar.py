"""ProgressBar: a live bar on a terminal."""

import keras

from trainer.loop.action import Action


class ProgressBar(Action):
    """A live bar on a terminal (stdout a TTY): steps/total, loss, examples/sec, ETA,
    updated at every loop boundary; Keras' Progbar draws it. It counts this run's
    steps (a resumed run's bar starts at 0 of the steps left), so its ETA holds."""

    on_interrupt, chief_only = True, True

    def __init__(self):
        self.bar, self.loss, self._last = None, None, None

    def should_run(self, controller, step, logs):
        return True

    def __call__(self, controller, step, logs):
        trainer = controller.trainer
        if self.bar is None:
            self.bar = keras.utils.Progbar(trainer.train_steps - controller.start_step,
                                           unit_name="step", stateful_metrics=["loss", "ex/s"])
        last_step, last_seconds = self._last or (controller.start_step, 0.0)
        values = []
        if step > last_step:
            seconds = max(controller.train_seconds - last_seconds, 1e-9)
            values.append(("ex/s", (step - last_step) * trainer.examples_per_step / seconds))
        self._last = (step, controller.train_seconds)
        self.loss = logs.get("train/loss", self.loss)
        if self.loss is not None:
            values.append(("loss", self.loss))
        self.bar.update(step - controller.start_step, values,
                        finalize=controller.done or controller.interrupted is not None or None)
