"""--mode=precision_check: the configured mixed policy against float32, layer by layer.

Two Trainers, one per policy, start from the same weights and train on the same
batches (the tasks' train order is a function of the step): the two loss curves.
At step 0, and after `numerics.check_steps` steps at the mixed run's weights, each
layer's gradient under the mixed policy is compared with float32's on one batch: cosine similarity, relative error, underflow (entries zero in the
mixed gradient but not in float32's) and, under float16, the headroom of the
scaled gradient: powers of two above float16's smallest subnormal (2^-24) and
below its largest value (65504). The verdict names the layers to keep in float32,
with the flag to pass. Dropout draws its noise in the compute dtype, so a model
with dropout gets different masks under the two policies: lower cosines there.
"""

import copy
import math
import os
import re

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from trainer.runtime.precision import choose_policy, layers_of, set_policy
from trainer.state.workdir import ChiefFiles
from trainer.step.telemetry import FLOAT16_MAX, FLOAT16_TINY
from trainer.step.trainer import Trainer
from trainer.task import get_task

MIN_COSINE, MAX_UNDERFLOW, MAX_LOSS_GAP = 0.98, 0.01, 0.1


def run(config, strategy, workdir, summary):
    precision_check(config, strategy, workdir, get_task)


def precision_check(config, strategy, workdir, make_task):
    """Runs the check and writes `workdir/precision_check.json` (and a PNG of the two
    loss curves if matplotlib is installed); returns the report."""
    mixed, _ = choose_policy(config.precision, strategy)
    if mixed == "float32":
        raise ValueError("--mode=precision_check compares a mixed policy with float32; set "
                         "--config.precision=mixed_float16 or mixed_bfloat16.")
    if mixed == "mixed_float16" and not tf.config.list_physical_devices("GPU"):
        logging.warning("float16 is emulated and slow on this CPU: keep "
                        "--config.numerics.check_steps small.")
    steps = config.numerics.check_steps
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"numerics.check_steps={steps!r} must be an integer >= 1.")
    # (Each build names its layers as a real run does: trainer/state/model_build.py.)
    reference_config = copy.deepcopy(config)
    reference_config.precision_overrides.float32_layers = ()
    trainers = {}
    for policy, c in ((mixed, config), ("float32", reference_config)):
        set_policy(policy, strategy)
        keras.utils.set_random_seed(config.seed)
        trainers[policy] = Trainer(c, make_task(c), strategy, workdir)
    reference, candidate = trainers["float32"], trainers[mixed]
    for a, b in zip(candidate.model.weights, reference.model.weights):
        b.assign(a)  # variables are float32 under both policies
    batch = next(iter(reference.task.build_inputs("train", tf.distribute.InputContext(), 0)))
    report = {"policy": mixed, "steps": steps, "layers": {}}
    report["layers"]["step 0"] = _compare(reference, candidate, batch, mixed)
    losses = {name: _train(trainers[name], steps) for name in trainers}
    # The two runs have drifted apart; gradients are compared at the mixed run's weights.
    for a, b in zip(candidate.model.weights, reference.model.weights):
        b.assign(a)
    report["layers"][f"step {steps}"] = _compare(reference, candidate, batch, mixed)
    report["loss"] = losses
    report["skipped_steps"] = int(candidate.loss_scale.skipped_steps.numpy())
    float32_already = {layer.path for layer in layers_of(candidate.model)
                       if layer.compute_dtype == "float32"}
    report["verdict"], report["advice"] = _verdict(report, mixed, float32_already)
    print(format_report(report))
    _write(report, workdir, ChiefFiles(candidate.is_chief))
    return report


def _train(trainer, steps):
    """The mean train loss of each of `steps` steps; shorter if the run diverged."""
    iterator = iter(trainer.distributed_dataset("train"))
    losses = []
    for _ in range(steps):
        trainer.train_loop(iterator, tf.constant(1, tf.int64))
        if int(trainer.nonfinite_streak.numpy()) >= trainer.max_nonfinite_steps:
            break  # the loop ran no step
        losses.append(float(trainer.train_metrics[0].result()))
        trainer.train_metrics[0].reset_state()
    return losses


def _gradients(trainer, batch):
    """{layer path: (unscaled gradient, scaled gradient)}, flattened per layer."""
    features, labels = batch
    _, _, scaled, _ = trainer._compute_gradients(features, labels, tf.constant(False))
    unscaled = trainer.loss_scale.get_unscaled_gradients(
        [tf.convert_to_tensor(g) for g in scaled])
    by_layer = {}
    for v, u, s in trainer.variables.with_gradient(  # none for an unused output's layers
            list(zip(trainer.trained_variables, unscaled, scaled))):
        layer = v.path.rsplit("/", 1)[0]
        pair = by_layer.setdefault(layer, ([], []))
        pair[0].append(np.ravel(u.numpy()))
        pair[1].append(np.ravel(tf.convert_to_tensor(s).numpy()))
    return {k: (np.concatenate(u), np.concatenate(s)) for k, (u, s) in by_layer.items()}


def _compare(reference, candidate, batch, policy):
    """Per layer: cosine, relative error and underflow of the mixed gradient vs
    float32's; headroom of the scaled gradient under float16."""
    ref, mixed = _gradients(reference, batch), _gradients(candidate, batch)
    rows = {}
    for (layer, (g, scaled)), (_, (g32, _)) in zip(mixed.items(), ref.items()):
        norm32, norm = np.linalg.norm(g32), np.linalg.norm(g)
        row = {
            "cosine": float(g32 @ g / (norm32 * norm)) if norm32 and norm else
            (1.0 if norm32 == norm == 0 else 0.0),
            "relative_error": (float(np.linalg.norm(g - g32) / norm32) if norm32
                               else (0.0 if norm == 0 else math.inf)),
            "underflow": float(np.mean((g == 0) & (g32 != 0))),
        }
        if policy == "mixed_float16":
            magnitudes = np.abs(scaled[scaled != 0])  # None: every entry is zero
            row["headroom_low_bits"] = (float(np.log2(magnitudes.min() / FLOAT16_TINY))
                                        if magnitudes.size else None)
            row["headroom_high_bits"] = (float(np.log2(FLOAT16_MAX / magnitudes.max()))
                                         if magnitudes.size else None)
        rows[layer] = row
    return rows


def _verdict(report, policy, float32_already):
    """("ok", []) or ("change", [what to do, with the flag])."""
    at_risk = sorted({layer for rows in report["layers"].values()
                      for layer, row in rows.items() if _at_risk(row)} - float32_already)
    advice = []
    for name, losses in report["loss"].items():
        if len(losses) < report["steps"]:
            advice.append(f"The {name} run diverged after {len(losses)} steps (non-finite "
                          "gradients): lower --config.optimizer.learning_rate first.")
    if at_risk:
        patterns = ", ".join(f'"{re.escape(layer)}"' for layer in at_risk)
        advice.append(f"Keep {', '.join(at_risk)} in float32: "
                      f"--config.precision_overrides.float32_layers='[{patterns}]'")
    if report["skipped_steps"] == report["steps"]:  # a few early skips are dynamic scaling
        advice.append(f"All {report['steps']} steps overflowed in float16: lower "
                      "--config.loss_scale.initial_scale=1024.0.")
    final32, final = (report["loss"]["float32"] or [math.nan])[-1], (
        report["loss"][policy] or [math.nan])[-1]
    if math.isfinite(final32) and not abs(final - final32) <= MAX_LOSS_GAP * abs(final32):
        advice.append(f"After {report['steps']} steps the {policy} loss is {final:.4g} against "
                      f"float32's {final32:.4g}: compare longer runs before trusting it.")
    return ("ok" if not advice else "change"), advice


def _at_risk(row):
    """Judged against float32 (headroom, an extreme value, is reported, not judged)."""
    return not (row["cosine"] >= MIN_COSINE and row["underflow"] <= MAX_UNDERFLOW)


def format_report(report):
    policy, steps = report["policy"], report["steps"]
    first, last = report["layers"]["step 0"], report["layers"][f"step {steps}"]
    fp16 = policy == "mixed_float16"
    header = (f"{'layer':56s} {'cos@0':>7s} {'err@0':>7s} {'under@0':>7s} "
              f"{'cos@' + str(steps):>7s} {'err@' + str(steps):>7s} {'under@' + str(steps):>8s}"
              + ("  headroom lo/hi bits" if fp16 else ""))
    lines = [f"Precision check: {policy} vs float32, same weights and batches, {steps} steps.",
             header]
    for layer, a in first.items():
        b = last[layer]
        line = (f"{layer[-56:]:56s} {a['cosine']:7.4f} {a['relative_error']:7.3f} "
                f"{a['underflow']:7.2%} {b['cosine']:7.4f} {b['relative_error']:7.3f} "
                f"{b['underflow']:8.2%}")
        if fp16:
            line += "  " + " / ".join("n/a" if a[k] is None else f"{a[k]:.1f}"
                                      for k in ("headroom_low_bits", "headroom_high_bits"))
        lines.append(line + ("   <- at risk" if _at_risk(a) or _at_risk(b) else ""))
    losses = report["loss"]
    lines.append("loss float32: " + " ".join(f"{x:.4g}" for x in losses["float32"]))
    lines.append(f"loss {policy}: " + " ".join(f"{x:.4g}" for x in losses[policy]))
    lines.append(f"Verdict: {report['verdict']}")
    lines += [f"  - {a}" for a in report["advice"]]
    return "\n".join(lines)


def _write(report, workdir, files):
    path = os.path.join(workdir, "precision_check.json")
    files.write_json(path, report)
    if not files.is_chief:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        logging.info("Wrote %s (pip install matplotlib for the loss-curve PNG).", path)
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, losses in report["loss"].items():
        ax.plot(range(1, len(losses) + 1), losses, label=name)
    ax.set(xlabel="step", ylabel="train loss", title="float32 vs " + report["policy"])
    ax.legend()
    png = os.path.join(workdir, "precision_check.png")
    with tf.io.gfile.GFile(png, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    logging.info("Wrote %s and %s.", path, png)
