"""The consistency check (`trainer.consistency_every`): do all replicas, on every
worker, still hold the same state?

Each replica applies the same all-reduced update to its own copy of every
variable, so the copies stay bitwise equal unless something breaks that: a
worker running other code or another TensorFlow, a kernel that computes
differently on one device, code that writes one replica's copy, a hardware
fault. tf.distribute never compares them, and a run that drifted apart trains
on, each replica a different model, while the chief saves its own.

The check all-gathers one integer per variable and replica, a position-weighted
sum of its elements' bit patterns (integer sums are exact in any order, so equal
copies give equal fingerprints on every device), and compares them. It runs every
`consistency_every` steps and before every checkpoint and evaluation, so that
every checkpoint a run writes holds a state all replicas agreed on; on a
difference it names the variables, stops the run and writes nothing more.
"""

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from trainer.loop.action import Action
from trainer.step.step_variables import SEED_STATE_NAME

SHOWN = 5  # differing variables named (and measured) in the error


class ReplicasDiverged(RuntimeError):
    """Replicas hold different values of a variable that must be equal on all."""


def checked_variables(trainer):
    """{name: variable} of what every replica must hold alike: the model's variables
    (BatchNormalization statistics too), the optimizer's (slots, iterations, EMA
    averages), the loss scale and the step. Left out, as different on each replica
    by design: the dropout seed states (`Trainer._reseed` gives each replica its own)
    and the train metrics (each replica's share until they are read)."""
    named = {n: v for n, v in trainer.variable_names.items() if not n.endswith(SEED_STATE_NAME)}
    named.update({f"optimizer/{n}": v for n, v in trainer.checkpoints.named["optimizer"].items()})
    scale = trainer.loss_scale
    named.update({"loss_scale/scale": scale.scale, "loss_scale/good_steps": scale.good_steps,
                  "loss_scale/skipped_steps": scale.skipped_steps, "global_step": trainer.step})
    return named


def local_value(variable):
    """This replica's copy (in a replica context) of a Keras or TensorFlow variable."""
    return tf.convert_to_tensor(variable.value if isinstance(variable, keras.Variable)
                                else variable)


def bit_sum(value):
    """The sum of the elements' bit patterns, each times an odd weight of its position, as
    int64 (wrapping): equal for equal tensors, and moved by swapped elements or by
    changes that would cancel in a plain sum (+1 ulp here, -1 ulp there)."""
    if value.dtype.is_floating:
        value = tf.bitcast(value, {1: tf.int8, 2: tf.int16, 4: tf.int32,
                                   8: tf.int64}[value.dtype.size])
    bits = tf.reshape(tf.cast(value, tf.int64), [-1])
    weights = 2 * tf.range(tf.size(bits, out_type=tf.int64), dtype=tf.int64) + 1
    return tf.reduce_sum(bits * weights)


class ConsistencyCheck(Action):
    """Every `every` steps, before the actions of `guarded` (those that save or
    evaluate) and at the end: raises ReplicasDiverged if replicas differ."""

    on_interrupt = True  # before the save of an interrupted run

    def __init__(self, every, guarded=()):
        self.every, self.guarded = every, list(guarded)
        self.last_equal = None  # the step of the last check that found all replicas equal

    def begin(self, controller):
        trainer = controller.trainer
        self.strategy = trainer.strategy
        self.replicas = self.strategy.num_replicas_in_sync
        if self.replicas == 1:
            logging.info("trainer.consistency_every=%d: one replica, nothing to compare.",
                         self.every)
            self.every = 0  # (no chunk boundaries for it either)
            return
        self.named = checked_variables(trainer)
        # Replicas are numbered worker by worker, each with its local devices.
        self.per_worker = len(self.strategy.extended.worker_devices)
        self._fingerprints = tf.function(self._fingerprints_fn)
        logging.info("Consistency check every %d steps and before each save and evaluation: "
                     "%d variables on %d replicas.", self.every, len(self.named), self.replicas)

    def should_run(self, controller, step, logs):
        return self.replicas > 1 and (
            super().should_run(controller, step, logs)
            or any(a.should_run(controller, step, logs) for a in self.guarded))

    def __call__(self, controller, step, logs):
        table = self._fingerprints().numpy()  # [replica, variable]
        differ = np.flatnonzero((table != table[0]).any(axis=0))
        if differ.size:
            raise ReplicasDiverged(self._message(controller, step, differ, table))
        self.last_equal = step

    def _fingerprints_fn(self):
        variables = list(self.named.values())

        def per_replica():
            local = tf.stack([bit_sum(local_value(v)) for v in variables])
            return tf.distribute.get_replica_context().all_gather(local[tf.newaxis], axis=0)

        return self.strategy.experimental_local_results(self.strategy.run(per_replica))[0]

    def _gathered(self, variables):
        """[replica, ...] of each of `variables`: a collective every worker runs alike,
        since every worker saw the same fingerprints."""
        def per_replica():
            context = tf.distribute.get_replica_context()
            return [context.all_gather(local_value(v)[tf.newaxis], axis=0) for v in variables]

        gathered = tf.function(lambda: self.strategy.run(per_replica))()
        return [self.strategy.experimental_local_results(g)[0].numpy() for g in gathered]

    def _replica(self, r):
        return (f"replica {r}" if self.per_worker == self.replicas
                else f"replica {r} (worker {r // self.per_worker})")

    def _message(self, controller, step, differ, table):
        names = list(self.named)
        shown = [names[i] for i in differ[:SHOWN]]
        lines = []
        for name, values in zip(shown, self._gathered([self.named[n] for n in shown])):
            values = values.astype(np.float64)
            gaps = [f"{self._replica(r)} by up to {np.max(np.abs(values[r] - values[0])):.3g}"
                    for r in range(1, self.replicas) if (table[r] != table[0])[names.index(name)]]
            lines.append(f"  {name}: {', '.join(gaps)}")
        last = (f"step {self.last_equal}" if self.last_equal is not None
                else "none in this launch")
        latest = (controller.trainer.checkpoints.latest or "none yet" if controller.is_chief
                  else "named in the chief's log")
        return (
            f"Replicas disagree at step {step}: {differ.size} of {len(names)} variables differ "
            "from replica 0's copy" + (f" (the first {SHOWN}):\n" if differ.size > SHOWN
                                       else ":\n") + "\n".join(lines) + "\n"
            f"The last check that found them equal: {last}. The run stops without writing "
            "anything more; every checkpoint it wrote was checked first, so the newest "
            f"({latest}) "
            "holds a state all replicas agreed on. Relaunching with the same --workdir "
            "resumes from it with every replica on the same values. If they drift apart "
            "again, look for what differs between the replicas: a worker running other code "
            "or another TensorFlow version, code that assigns one replica's copy, or faulty "
            "hardware.")


def consistency_check(trainer, actions):
    """The ConsistencyCheck `trainer.consistency_every` asks for (None if 0), guarding
    the `actions` that save or evaluate."""
    interval = trainer.config.trainer.consistency_every
    if not interval:
        return None
    return ConsistencyCheck(interval, [a for a in actions if a.kind in ("checkpoint", "eval")])

