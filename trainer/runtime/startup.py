"""The start of a launch phase by phase: where the seconds before the first step go.

The code that ends a phase marks it (`mark`); the Controller takes the marks of
its launch when its loop starts and the ledger keeps them with the launch's
`start` event. A phase is timed from the end of the one marked before it (the
first from the launch's start): imports (to the command's first line: Python,
TensorFlow, Keras), strategy, build (the Trainer: precision, task, model,
optimizer, checkpoints), restore, data (the train iterator), jit_choice (before
the first step; on a CPU it is decided after the first chunk); what is not marked
is `other`. Tracing and compiling are the first chunk's (the ledger's
`compile`), the FLOPs count is timed where it runs (the first log).
"""

import time

_marks = []  # (phase, epoch seconds when it ended)


def mark(phase):
    """Records that `phase` of this launch's start ended now."""
    _marks.append((phase, time.time()))


def take(launched, now=None):
    """{phase: seconds} of the phases marked since `launched` (epoch seconds), in the
    order marked, with `other` the rest up to `now`; forgets every mark."""
    now = time.time() if now is None else now
    phases, last = {}, launched
    for phase, at in _marks:
        if launched <= at <= now:
            phases[phase] = round(phases.get(phase, 0.0) + max(at - last, 0.0), 4)
            last = at
    _marks.clear()
    phases["other"] = round(max(now - last, 0.0), 4)
    return phases


def describe(phases):
    """'imports 3.4, strategy 0.1, ...' in seconds."""
    return ", ".join(f"{name.replace('_', ' ')} {seconds:.1f}" for name, seconds in phases.items())
