"""An action that makes one replica's copy of a variable differ, for the consistency check."""

import tensorflow as tf

from trainer import Action


class OneReplicaDrifts(Action):
    """At step `at`, adds `delta` to the last replica's copy of model variable `name` (on
    the last worker); every worker runs it, so its chunk boundaries match."""

    at_end = False

    def __init__(self, name, at, delta=1e-6):
        self.name, self.at, self.delta, self.every = name, at, delta, at

    def __call__(self, controller, step, logs):
        trainer = controller.trainer
        resolver = getattr(trainer.strategy, "cluster_resolver", None)
        last_worker = (resolver is None or resolver.task_id
                       == resolver.cluster_spec().num_tasks(resolver.task_type) - 1)
        if step == self.at and last_worker:
            copy = trainer.strategy.experimental_local_results(
                trainer.variable_names[self.name].value)[-1]
            copy.assign_add(tf.fill(copy.shape, self.delta))
