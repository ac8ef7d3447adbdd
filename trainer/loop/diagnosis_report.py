"""The diagnosis' words: from the replayed step's layer rows (trainer/step/inspection.py)
to the layer that failed, in which dtype and pass, why, the fix that follows, and the
command that resumes the run with it."""

import json
import shlex
import sys

import tensorflow as tf

from trainer.step.inspection import COLUMNS

FLOAT32_LAYERS = "--config.precision_overrides.float32_layers"
_COL = {name: i for i, name in enumerate(COLUMNS)}


def report(trainer, diverged, found):
    """diagnosis.json's content: `found` (what the replay found) explained."""
    outcome = found["outcome"]
    base = {"diverged_at": diverged.step, "outcome": outcome,
            "replayed_from_state": found.get("source"), "seconds": found["seconds"],
            "precision": trainer.policy}
    if "seconds_per_step" in found:
        base["replay_seconds_per_step"] = found["seconds_per_step"]
    if found.get("retried_deterministic"):
        base["retried_deterministic"] = True
    explain = {"nonfinite": _nonfinite, "update": _update, "finite": _finite,
               "gave_up": _gave_up, "no_state": _no_state}[outcome]
    return dict(base, **explain(trainer, diverged, found))


def _nonfinite(trainer, diverged, found):
    rows = dict(zip(found["paths"], found["stats"]))
    order = found["paths"]
    layers = found["layers"]
    forward = _deepest([p for p in order if rows[p][_COL["nonfinite_outputs"]]
                        and not rows[p][_COL["nonfinite_inputs"]]])
    backward = _deepest([p for p in order if not rows[p][_COL["nonfinite_output_grads"]]
                         and (rows[p][_COL["nonfinite_input_grads"]]
                              or rows[p][_COL["nonfinite_weight_grads"]])])
    step, op = found["step"], found.get("op")
    if forward:
        where, path = "forward", forward[0]  # the first whose output went non-finite
        column = "largest_output"
    elif not found["loss_finite"]:
        return _finish(trainer, found, {
            "pass": "loss", "layer": None, "op": op,
            "why": f"step {step}: the model's outputs are finite but the loss "
                   "(Task.compute_loss) is not: a log of a zero probability, a division "
                   "by a zero count?",
            "fix": "compute the loss from logits (from_logits=True) or guard the "
                   "operation the op names"}, flags=[])
    elif backward:
        where, path = "backward", backward[-1]  # the first the backward pass reaches
        column = "largest_input_grad"
    else:
        return _finish(trainer, found, {
            "pass": None, "layer": None, "op": op,
            "why": f"step {step} was non-finite again, but no layer's output or gradient "
                   "was: the all-reduce or the optimizer's update?",
            "fix": "a lower --config.optimizer.learning_rate or --config.optimizer.clip_norm"
                   "=1.0"}, flags=[])
    layer = layers[path]
    dtype = layer.compute_dtype
    dtype_max = float(tf.as_dtype(dtype).max)
    before = dict(zip(order, found["largest_before"])) if len(found["largest_before"]) \
        else {}
    largest_before = float(before[path][_COL[column]]) if path in before else None
    steps_before = step - found["replayed_from"] - 1
    bad_grads = rows[path][_COL["nonfinite_input_grads"]] + rows[path][
        _COL["nonfinite_weight_grads"]]
    if where == "forward":
        why = (f"step {step}: the output of '{path}' ({type(layer).__name__}, computing in "
               f"{dtype}) became non-finite in the forward pass "
               f"({rows[path][_COL['nonfinite_outputs']]:.0f} entries inf or NaN) from "
               "finite inputs")
    else:
        why = (f"step {step}: in the backward pass, the gradient of '{path}' "
               f"({type(layer).__name__}, computing in {dtype}) became non-finite "
               f"({bad_grads:.0f} entries of its inputs' and weights' gradients) while the "
               "gradient of its output was finite")
    why += (f"; its largest finite {'output' if where == 'forward' else 'gradient'} "
            f"magnitude on the {steps_before} steps replayed before was "
            f"{largest_before:.4g}, against {dtype}'s largest, {dtype_max:.6g}"
            if largest_before is not None else
            f"; no finite step was replayed before it ({dtype}'s largest is {dtype_max:.6g})")
    unscaled = found.get("unscaled")
    finite_unscaled = None
    if where == "backward" and unscaled is not None:
        u = dict(zip(order, unscaled))[path]
        finite_unscaled = not (u[_COL["nonfinite_input_grads"]]
                               or u[_COL["nonfinite_weight_grads"]])
        why += (f"; with the loss scale at 1 instead of {found['loss_scale']:g} it is "
                + ("finite: the scaled gradient overflowed" if finite_unscaled
                   else "non-finite too"))
    overflow = dtype in ("float16", "bfloat16") and (
        where == "forward" or finite_unscaled is False)
    pattern = _pathed(path, layers)
    if overflow:
        patterns = list(trainer.config.precision_overrides.float32_layers) + [pattern]
        fix = f"keep '{pattern}' in float32"
        flags = [f"{FLOAT32_LAYERS}={json.dumps(patterns)}"]
    elif where == "forward":
        fix = ("the values grow beyond float32: a lower learning rate and gradient "
               "clipping, or inputs normalized")
        flags = [f"--config.optimizer.learning_rate="
                 f"{float(trainer.config.optimizer.learning_rate) / 10:g}",
                 "--config.optimizer.clip_norm=1.0"]
    elif finite_unscaled:
        fix = ("the dynamic loss scale did not come down in time: a larger "
               "--config.trainer.max_nonfinite_steps, or mixed_bfloat16")
        flags = [f"--config.trainer.max_nonfinite_steps={2 * trainer.max_nonfinite_steps}"]
    else:
        fix = (f"the derivative of an op in '{path}' is infinite or undefined at the values "
               "it got (a log, sqrt, division or pow at 0; under tf.where both branches are "
               "differentiated, so the untaken one needs a safe input too): change the "
               "code, then resume")
        flags = []
    return _finish(trainer, found, {
        "pass": where, "layer": path, "layer_class": type(layer).__name__,
        "compute_dtype": dtype, "dtype_max": dtype_max, "largest_before": largest_before,
        "steps_replayed_before": steps_before, "finite_at_loss_scale_1": finite_unscaled,
        "op": op,
        "why": why, "fix": fix}, flags)


def _update(trainer, diverged, found):
    names = found["variables"]
    return _finish(trainer, found, {
        "pass": "update", "variables": names[:20],
        "why": f"step {found['step']}: the gradients were finite, but the update made "
               f"{len(names)} variable(s) non-finite, first {names[0]}",
        "fix": "a lower learning rate and gradient clipping"},
        [f"--config.optimizer.learning_rate="
         f"{float(trainer.config.optimizer.learning_rate) / 10:g}",
         "--config.optimizer.clip_norm=1.0"])


def _finite(trainer, diverged, found):
    deterministic = trainer.config.trainer.deterministic or found.get("retried_deterministic")
    return {"why": f"the replay from step {found['replayed_from']} reached step "
                   f"{found['step']} and every step of it stayed finite"
                   + (", with deterministic ops too" if deterministic else "")
                   + ": the divergence did not reproduce (ops that are not deterministic, "
                   "or a fault of the machine)",
            "fix": "resume; with --config.trainer.deterministic=True a divergence replays "
                   "exactly", "resume_command": resume_command([])}


def _gave_up(trainer, diverged, found):
    return {"why": f"gave up after trainer.diagnose_max_seconds={found['budget_seconds']:g}: "
                   f"replayed steps {found['replayed_from']} to {found['replayed_to']} of "
                   f"{diverged.step}, all finite",
            "fix": "a larger --config.trainer.diagnose_max_seconds, or more frequent "
                   "checkpoints (--config.trainer.checkpoint_every), shorten the replay",
            "resume_command": resume_command([])}


def _no_state(trainer, diverged, found):
    return {"why": "no checkpoint and no copy of the start state to replay from",
            "fix": "keep --config.trainer.diagnose=True from the start of the run",
            "resume_command": resume_command([])}


def _finish(trainer, found, fields, flags):
    fields["fix_flags"] = flags
    fields["resume_command"] = resume_command(flags)
    return fields


def summary_line(diagnosis):
    """One line: where it broke, why, and what to run."""
    parts = [diagnosis["why"]]
    if diagnosis.get("op") and diagnosis["op"].get("op"):
        op = diagnosis["op"]
        parts.append(f"first non-finite op (check_numerics): {op['op']} {op['node']}"
                     + (f", created at {op['created_at']}" if op.get("created_at") else ""))
    parts.append(f"fix: {diagnosis['fix']}")
    parts.append(f"resume from the last good checkpoint with: {diagnosis['resume_command']}")
    return "Diagnosis (diagnosis.json): " + ". ".join(parts) + "."


def resume_command(flags):
    """This launch's command with `flags` (replacing the same fields), or, outside the
    command line, the flags to add."""
    argv = list(sys.argv)
    if not any(a.startswith("--workdir") for a in argv):
        return "relaunch with the same --workdir" + (" and " + " ".join(
            shlex.quote(f) for f in flags) if flags else "")
    fields = {f.split("=", 1)[0] for f in flags}
    kept = [a for a in argv[1:] if a.split("=", 1)[0] not in fields]
    program = (["python", argv[0]] if argv[0].endswith(".py") else [argv[0]])
    return " ".join(shlex.quote(a) for a in program + kept + flags)


def _deepest(paths):
    """`paths` less those that contain another of them (a block, when its layer failed)."""
    return [p for p in paths if not any(q.startswith(p + "/") for q in paths)]


def _pathed(path, layers):
    """The nearest layer at or above `path` that Keras gives a path (what
    precision_overrides matches)."""
    while path not in layers or not layers[path].path:
        path = path.rsplit("/", 1)[0]
    return path
