"""The model's variables by the role the train step gives them.

- trained: what the optimizer updates (trainable float variables, less
  `optimizer.freeze`). Those the loss does not reach (an unused output, a branch
  not taken) get no gradient: they are named once and left out of the
  all-reduce, the global norm and the update, the same on every replica.
- seeds: the dropout `SeedGenerator` states, set per micro-batch by the Trainer.
- state: the other non-trainable variables, which the forward pass may update
  on each replica from its own examples. Float state (BN statistics) is
  averaged over replicas; other state (counters, flags) takes the first
  replica's value through an int64 all-reduce, never float math. A skipped
  step puts all of it back.
"""

import tensorflow as tf
from absl import logging

SEED_STATE_NAME = "seed_generator_state"  # what keras.random.SeedGenerator names its state


class StepVariables:

    def __init__(self, names, trained, constant=()):
        """`names`: {name: variable} of the model; `trained`: {name: variable} the
        optimizer was built for; `constant`: variables of layers with trainable=False,
        which Keras does not update (a frozen BatchNormalization runs in inference mode),
        so they are not synchronized."""
        self.names = names
        self.trained = list(trained.values())
        self.seeds = [v for v in names.values() if v.path.endswith(SEED_STATE_NAME)]
        constant = {id(v) for v in constant}
        state = [v for v in names.values() if not v.trainable and id(v) not in constant
                 and not v.path.endswith(SEED_STATE_NAME)]
        self.averaged = [v for v in state if tf.as_dtype(v.dtype).is_floating]
        self.from_first_replica = [v for v in state if not tf.as_dtype(v.dtype).is_floating]
        self.has_gradient = None  # per trained variable, known once the step is traced

    # --------------------------------------------------------------- gradients

    def note_gradients(self, grads):
        """Records (when the step is traced) which trained variables `grads` (the tape's,
        None where there is none) leaves out, and names them once."""
        has_gradient = [g is not None for g in grads]
        if has_gradient != self.has_gradient and not all(has_gradient):
            missing = {id(v) for v, has in zip(self.trained, has_gradient) if not has}
            names = [n for n, v in self.names.items() if id(v) in missing]
            logging.warning("%d trainable variables get no gradient from the loss and are not "
                            "updated (an unused output or branch?): %s", len(names),
                            ", ".join(names))
        self.has_gradient = has_gradient

    def with_gradient(self, values):
        """Of per-trained-variable `values`, those of the variables that get a gradient."""
        return [x for x, has in zip(values, self.has_gradient) if has]

    @property
    def updated(self):
        return self.with_gradient(self.trained)

    def with_missing(self, grads):
        """Per trained variable: `grads` (of `updated`) where there is one, zeros elsewhere."""
        grads = iter(grads)
        return [next(grads) if has else tf.zeros(v.shape)
                for v, has in zip(self.trained, self.has_gradient)]

    # ------------------------------------------------------------------- state

    @property
    def state(self):
        return self.averaged + self.from_first_replica

    def snapshot(self):
        return [tf.identity(v.value) for v in self.state]

    def synchronized(self, replica):
        """The state after this replica's forward pass, the same on every replica."""
        values = (replica.all_reduce(tf.distribute.ReduceOp.MEAN,
                                     [tf.identity(v.value) for v in self.averaged])
                  if self.averaged else [])
        if not self.from_first_replica:
            return values
        first = tf.equal(replica.replica_id_in_sync_group, 0)
        exact = [tf.cast(v.value, tf.int64) for v in self.from_first_replica]
        summed = replica.all_reduce(tf.distribute.ReduceOp.SUM,
                                    [tf.where(first, x, tf.zeros_like(x)) for x in exact])
        return values + [tf.cast(x, v.dtype) for x, v in zip(summed, self.from_first_replica)]

    def keep_if(self, finite, after, before):
        """Assigns `after` (`synchronized`) on a finite step, `before` (`snapshot`) else."""
        for v, new, old in zip(self.state, after, before):
            v.assign(tf.where(finite, new, old))
