"""Gradient telemetry: per-variable statistics recorded inside the compiled step every
`numerics.every` steps, written under `numerics/` in TensorBoard, and a report of the
layers at risk at the end of the run (`workdir/numerics.json`).

Statistics come from the gradients the step already has (after the all-reduce,
so every replica holds the same): the unscaled norm, the fraction of entries that
are exactly zero and, under float16, the smallest non-zero and largest magnitude
of the *scaled* gradient, from which each layer's headroom is read: powers of two
above float16's smallest subnormal (2^-24) and below its largest value (65504).
With `every = 0` none of this is traced into the step.
"""

import math
import os
import re

import numpy as np
import tensorflow as tf
from absl import logging

from trainer.actions import Action

FLOAT16_TINY, FLOAT16_MAX = 2.0**-24, 65504.0
# ReLU layers have many exactly-zero gradient entries in any precision; almost all
# zero under float16 is worth a --mode=precision_check. Headroom below 65504 is
# reported, not judged: dynamic loss scaling keeps it small on purpose.
MIN_HEADROOM_BITS, MOSTLY_ZERO = 2.0, 0.9


class GradientTelemetry:
    """The statistics' variables (not checkpointed) and the compiled code that fills them."""

    def __init__(self, variables, every):
        self.paths, self.every = [v.path for v in variables], every
        zeros = tf.zeros([len(variables)])
        with tf.name_scope("numerics"):
            self.norm = tf.Variable(zeros, trainable=False, name="grad_norm")
            self.zero_fraction = tf.Variable(zeros, trainable=False, name="grad_zero_fraction")
            self.smallest = tf.Variable(zeros, trainable=False, name="scaled_grad_smallest")
            self.largest = tf.Variable(zeros, trainable=False, name="scaled_grad_largest")
            self.recorded_at = tf.Variable(tf.constant(-1, tf.int64), trainable=False,
                                           name="recorded_at")

    def record(self, step, grads, scaled_grads, finite):
        """Cross-replica, in the step: records the statistics of one replica's (reduced,
        so identical) gradients when `step` is a multiple of `every` and finite."""
        def compute():
            with tf.name_scope("numerics"):
                magnitudes = [tf.abs(tf.reshape(g, [-1])) for g in scaled_grads]
                self.norm.assign(tf.stack([tf.norm(g) for g in grads]))
                self.zero_fraction.assign(tf.stack(
                    [tf.reduce_mean(tf.cast(tf.equal(g, 0), tf.float32)) for g in grads]))
                self.smallest.assign(tf.stack([tf.reduce_min(
                    tf.where(m > 0, m, tf.float32.max)) for m in magnitudes]))
                self.largest.assign(tf.stack([tf.reduce_max(m) for m in magnitudes]))
                self.recorded_at.assign(step)
            return tf.constant(True)

        tf.cond(tf.logical_and(finite, tf.equal(step % self.every, 0)), compute,
                lambda: tf.constant(False))


class NumericsLog(Action):
    """Writes the recorded statistics under `numerics/` at each `every` steps, keeps each
    layer's worst values, and at the end logs and saves the layers at risk."""

    on_interrupt = True  # a run stopped to be resumed still gets its report

    def __init__(self, telemetry, float16, path, compute_dtypes):
        self.telemetry, self.float16, self.path = telemetry, float16, path
        self.compute_dtypes = compute_dtypes  # layer path -> compute dtype
        self.every = telemetry.every
        self.worst = {}  # layer -> {statistic: worst value seen}

    def __call__(self, controller, step, logs):
        t = self.telemetry
        if int(t.recorded_at.numpy()) == step:
            scalars = {}
            for path, norm, zero in zip(t.paths, t.norm.numpy(), t.zero_fraction.numpy()):
                scalars[f"numerics/grad_norm/{path}"] = float(norm)
                scalars[f"numerics/grad_zero_fraction/{path}"] = float(zero)
            for layer, stats in self._layers().items():
                worst = self.worst.setdefault(layer, {})
                for name, value in stats.items():
                    scalars[f"numerics/{name}/{layer}"] = value
                    pick = max if name == "grad_zero_fraction" else min
                    worst[name] = pick(worst.get(name, value), value)
            controller.summaries.scalars("train", scalars, step)
        if (controller.done or controller.interrupted) and self.worst:
            self._report(controller, step)  # (a finished run relaunched records nothing)

    def _layers(self):
        """Per layer: the largest zero fraction of its variables and, under float16,
        the headroom of its scaled gradients in powers of two."""
        t, layers = self.telemetry, {}
        for path, zero, small, large in zip(t.paths, t.zero_fraction.numpy(),
                                            t.smallest.numpy(), t.largest.numpy()):
            stats = layers.setdefault(path.rsplit("/", 1)[0], {"grad_zero_fraction": 0.0})
            stats["grad_zero_fraction"] = max(stats["grad_zero_fraction"], float(zero))
            if self.float16 and large > 0:
                low, high = math.log2(small / FLOAT16_TINY), math.log2(FLOAT16_MAX / large)
                stats["headroom_low_bits"] = min(stats.get("headroom_low_bits", low), low)
                stats["headroom_high_bits"] = min(stats.get("headroom_high_bits", high), high)
        return layers

    def _report(self, controller, step):
        at_risk = {}
        for layer, worst in self.worst.items():
            if self.compute_dtypes.get(layer) == "float32":
                continue  # nothing to gain from float32 there
            why = []
            if self.float16 and worst.get("grad_zero_fraction", 0) > MOSTLY_ZERO:
                why.append(f"{worst['grad_zero_fraction']:.0%} of gradient entries are zero")
            if worst.get("headroom_low_bits", math.inf) < MIN_HEADROOM_BITS:
                why.append(f"scaled gradients {worst['headroom_low_bits']:.1f} powers of two "
                           "above float16's underflow")
            if why:
                at_risk[layer] = why
        advice = []
        if at_risk:
            patterns = ", ".join(f'"{re.escape(layer)}"' for layer in sorted(at_risk))
            advice.append("Compare them with float32 (--mode=precision_check), then keep "
                          "those it confirms in float32: --config.precision_overrides."
                          f"float32_layers='[{patterns}]'.")
        report = {"step": step, "layers": self.worst, "at_risk": at_risk, "advice": advice}
        controller.files.write_json(self.path, report)
        if at_risk:
            logging.warning("Numerics: %d layers at risk: %s. %s", len(at_risk), "; ".join(
                f"{layer}: {', '.join(why)}" for layer, why in sorted(at_risk.items())),
                " ".join(advice))
        else:
            logging.info("Numerics: no layer at risk (%d layers watched); %s.",
                         len(self.worst), self.path)
