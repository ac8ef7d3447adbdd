"""The diagnosis' words: from the replayed step's layer rows (trainer/step/inspection.py)
to the layer that failed, in which dtype and pass, why, the fix that follows, and the
command that resumes the run with it."""

import json
import shlex
import sys

import tensorflow as tf

from trainer.step.inspection import COLUMNS, inside

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
    step, op = found["step"], found.get("op")
    rows = dict(zip(found["paths"], found["stats"]))
    batch = found["batch"]
    if batch["nonfinite_features"] or batch["nonfinite_labels"]:
        return _finish(trainer, found, {
            "pass": "input", "layer": None, "op": op,
            "why": f"step {step}: its batch holds inf or NaN ({batch['nonfinite_features']:.0f} "
                   f"entries in the features, {batch['nonfinite_labels']:.0f} in the labels)",
            "fix": "find the bad examples of that step's batch (the order is a function of "
                   "the step) and clean or skip them in the Task's input"}, [])
    where, path = origin(rows, found["parents"])
    if where is None:
        loss = batch["nonfinite_loss"] and not any(r[_COL["nonfinite_outputs"]]
                                                   for r in rows.values())
        why = (f"step {step}: the model's outputs are finite but the loss (Task.compute_loss) "
               "is not" if loss else
               f"step {step} is non-finite again, but no layer's output or gradient was")
        fix = ("guard the op named (a log of a zero probability: compute the loss from "
               "logits)" if loss else "a lower learning rate and gradient clipping")
        flags = [] if loss else _lower_rate(trainer)
        if found["jit_compile"] and not loss:  # the inspection runs without XLA
            why += " when run without XLA, as the inspection is: XLA's fused ops overflow"
            fix, flags = "train without XLA", ["--config.trainer.jit_compile=off"]
        return _finish(trainer, found, {"pass": "loss" if loss else None, "layer": None,
                                        "op": op, "why": why, "fix": fix}, flags)
    layer = found["layers"][path]
    dtype = layer.compute_dtype
    dtype_max = float(tf.as_dtype(dtype).max)
    row = rows[path]
    column = "largest_output" if where == "forward" else "largest_input_grad"
    before = dict(zip(found["paths"], found["largest_before"]))
    largest_before = float(before[path][_COL[column]]) if path in before else None
    steps_before = step - found["replayed_from"] - 1
    own_call = [c for c, parent in found["parents"].items() if parent == path]
    subject = (f"'{path}' ({type(layer).__name__}, computing in {dtype}; in its own code, "
               "not in a sublayer)" if own_call else
               f"'{path}' ({type(layer).__name__}, computing in {dtype})")
    if where == "forward":
        why = (f"step {step}: in the forward pass, {subject} turned finite inputs into "
               f"non-finite outputs ({row[_COL['nonfinite_outputs']]:.0f} entries, "
               f"{row[_COL['inf_outputs']]:.0f} of them inf)")
        infs = row[_COL["inf_outputs"]]
    else:
        why = (f"step {step}: in the backward pass, {subject} turned the finite gradient "
               "of its output into non-finite gradients ("
               f"{row[_COL['nonfinite_input_grads']] + row[_COL['nonfinite_weight_grads']]:.0f}"
               f" entries of its inputs' and weights' gradients, "
               f"{row[_COL['inf_input_grads']]:.0f} inf)")
        infs = row[_COL["inf_input_grads"]]
    why += (f"; its largest finite {'output' if where == 'forward' else 'gradient'} "
            f"magnitude on the {steps_before} steps replayed before was "
            f"{largest_before:.4g}, against {dtype}'s largest, {dtype_max:.6g}"
            if largest_before is not None else
            f"; no finite step was replayed before it ({dtype}'s largest is {dtype_max:.6g})")
    finite_unscaled = None
    if where == "backward" and found.get("unscaled") is not None:
        u = dict(zip(found["paths"], found["unscaled"]))[path]
        finite_unscaled = not (u[_COL["nonfinite_input_grads"]]
                               or u[_COL["nonfinite_weight_grads"]])
        why += (f"; with the loss scale at 1 instead of {found['loss_scale']:g} it is "
                + ("finite: the scaled gradient overflowed" if finite_unscaled
                   else "non-finite too"))
    fix, flags = _fix(trainer, where, path, found, dtype, infs, finite_unscaled, own_call)
    return _finish(trainer, found, {
        "pass": where, "layer": path, "layer_class": type(layer).__name__,
        "compute_dtype": dtype, "dtype_max": dtype_max, "largest_before": largest_before,
        "steps_replayed_before": steps_before, "finite_at_loss_scale_1": finite_unscaled,
        "op": op, "why": why, "fix": fix}, flags)


def origin(rows, parents):
    """("forward" | "backward", the innermost layer where values turned non-finite), or
    (None, None). Forward: the first such layer the pass returned from; backward: the
    last (the backward pass reaches it first)."""
    for where, column, pick in (("forward", "forward_origins", 0),
                                ("backward", "backward_origins", -1)):
        origins = [p for p, row in rows.items() if row[_COL[column]]]
        innermost = [p for p in origins if not any(inside(q, p, parents) for q in origins)]
        if innermost:
            return where, innermost[pick]
    return None, None


def _fix(trainer, where, path, found, dtype, infs, finite_unscaled, own_call):
    """(the fix in words, the flags that apply it)."""
    pattern = _pathed(path, found["layers"], found["parents"])
    if found.get("finite_in_float32"):  # the step replayed with that layer in float32
        patterns = list(trainer.config.precision_overrides.float32_layers) + [pattern]
        fix = (f"keep '{pattern}' in float32: replayed so, step {found['step']} is finite"
               + (" (its sublayers go too; or cast the named op's inputs to float32 in its "
                  "call)" if own_call else ""))
        return fix, [f"{FLOAT32_LAYERS}={json.dumps(patterns)}"]
    if finite_unscaled:
        return ("the dynamic loss scale did not come down in time: a larger "
                "--config.trainer.max_nonfinite_steps, or mixed_bfloat16",
                [f"--config.trainer.max_nonfinite_steps={2 * trainer.max_nonfinite_steps}"])
    tried = (f" (replayed with '{pattern}' in float32 it is not finite either)"
             if found.get("finite_in_float32") is False else "")
    if infs and where == "forward":
        return (f"the values grow beyond {dtype}'s range{tried}: a lower learning rate and "
                "gradient clipping, or inputs normalized", _lower_rate(trainer))
    return (f"an op in '{path}' gives NaN, or an infinite derivative, at the values it got"
            f"{tried} (0/0, a log, sqrt, division or pow at 0; under tf.where both branches "
            "are differentiated, so the untaken one needs a safe input too): change the code "
            "(the op named), then resume", [])


def _lower_rate(trainer):
    return [f"--config.optimizer.learning_rate="
            f"{float(trainer.config.optimizer.learning_rate) / 10:g}",
            "--config.optimizer.clip_norm=1.0"]


def _update(trainer, diverged, found):
    names = found["variables"]
    return _finish(trainer, found, {
        "pass": "update", "variables": names[:20],
        "why": f"step {found['step']}: the gradients were finite, but the update made "
               f"{len(names)} variable(s) non-finite, first {names[0]}",
        "fix": "a lower learning rate and gradient clipping"},
        _lower_rate(trainer))


def _finite(trainer, diverged, found):
    deterministic = trainer.config.trainer.deterministic or found.get("retried_deterministic")
    return {"why": f"the replay from step {found['replayed_from']} reached step "
                   f"{found['step']} and every step of it stayed finite"
                   + (", with deterministic ops too" if deterministic else "")
                   + ": the divergence did not reproduce (ops that are not deterministic, "
                   "an input that is not a function of the step, as data.service's, or a "
                   "fault of the machine)"
                   + (f"; the deterministic replay failed: {found['retry_failed']}"
                      if found.get("retry_failed") else ""),
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
    kept, skip = [], False
    for a in argv[1:]:
        if skip:  # the value of a replaced "--field value"
            skip = False
        elif a.split("=", 1)[0] in fields:
            skip = "=" not in a
        else:
            kept.append(a)
    program = (["python", argv[0]] if argv[0].endswith(".py") else [argv[0]])
    return " ".join(shlex.quote(a) for a in program + kept + flags)


def _pathed(path, layers, parents):
    """The nearest layer at or above `path` that Keras gives a path (what
    precision_overrides matches)."""
    while not layers[path].path and parents.get(path) is not None:
        path = parents[path]
    return path
