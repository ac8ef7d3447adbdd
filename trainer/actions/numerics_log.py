"""The NumericsLog action: writes the telemetry the compiled step recorded
(`trainer/step/telemetry.py`) under `numerics/` in TensorBoard every
`numerics.every` steps, and at the end of the run reports the layers at risk
(`workdir/numerics.json`)."""

import math
import re

from absl import logging

from trainer.loop.action import Action
from trainer.step.telemetry import (FLOAT16_MAX, FLOAT16_TINY, LOG2_LOW, MIN_HEADROOM_BITS,
                                    MOSTLY_ZERO, layer_of)


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
        t, layers = self.telemetry, {}
        if int(t.recorded_at.numpy()) == step:
            scalars = {}
            for path, norm, zero in zip(t.paths, t.norm.numpy(), t.zero_fraction.numpy()):
                scalars[f"numerics/grad_norm/{path}"] = float(norm)
                scalars[f"numerics/grad_zero_fraction/{path}"] = float(zero)
            controller.summaries.scalars("train", scalars, step)
            layers = self._gradient_statistics()
            controller.summaries.histograms("train", {
                f"numerics/scaled_grad_log2/{layer}": (LOG2_LOW, counts)
                for layer, counts in self._layer_histograms().items()}, step)
        if int(t.activations_at.numpy()) == step:
            for layer, stats in self._activation_statistics().items():
                layers.setdefault(layer, {}).update(stats)
        for layer, stats in layers.items():
            worst = self.worst.setdefault(layer, {})
            for name, value in stats.items():
                pick = min if name.startswith("headroom") else max
                worst[name] = pick(worst.get(name, value), value)
        controller.summaries.scalars("train", {
            f"numerics/{name}/{layer}": value
            for layer, stats in layers.items() for name, value in stats.items()}, step)
        if (controller.done or controller.interrupted) and self.worst:
            self._report(controller, step)  # (a finished run relaunched records nothing)

    def _gradient_statistics(self):
        """Per layer: the largest zero fraction of its variables and, under float16,
        the headroom of its scaled gradients in powers of two."""
        t, layers = self.telemetry, {}
        for path, zero, small, large in zip(t.paths, t.zero_fraction.numpy(),
                                            t.smallest.numpy(), t.largest.numpy()):
            stats = layers.setdefault(layer_of(path), {"grad_zero_fraction": 0.0})
            stats["grad_zero_fraction"] = max(stats["grad_zero_fraction"], float(zero))
            if self.float16 and large > 0:
                low, high = math.log2(small / FLOAT16_TINY), math.log2(FLOAT16_MAX / large)
                stats["headroom_low_bits"] = min(stats.get("headroom_low_bits", low), low)
                stats["headroom_high_bits"] = min(stats.get("headroom_high_bits", high), high)
        return layers

    def _layer_histograms(self):
        counts = {}
        for path, row in zip(self.telemetry.paths, self.telemetry.histogram.numpy()):
            layer = layer_of(path)
            counts[layer] = counts[layer] + row if layer in counts else row
        return counts

    def _activation_statistics(self):
        probe, layers = self.telemetry.activations, {}
        for path, (largest, zero, nonfinite) in zip(probe.paths,
                                                    self.telemetry.activation.numpy()):
            if path in probe.seen:
                layers[path] = {"activation_max_abs": float(largest),
                                "activation_zero_fraction": float(zero),
                                "activation_nonfinite_fraction": float(nonfinite)}
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
            if worst.get("activation_nonfinite_fraction", 0) > 0:
                why.append(f"{worst['activation_nonfinite_fraction']:.2%} of outputs inf/NaN")
            elif self.float16 and worst.get("activation_max_abs", 0) > (
                    FLOAT16_MAX / 2**MIN_HEADROOM_BITS):
                why.append(f"outputs reach {worst['activation_max_abs']:.4g}, near float16's "
                           "largest value 65504")
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
