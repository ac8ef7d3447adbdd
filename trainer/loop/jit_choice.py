"""`trainer.jit_compile`: XLA for the forward and backward pass, or not, chosen per model.

"on" and "off" force it; TPUs always compile. "auto" (the default) times the
forward and backward pass (the part `jit_compile` changes; the all-reduce and
the update are outside it) on one real batch both ways, a few calls each after
its compilation, keeps the faster, logs both, and stores the choice in
`workdir/jit_compile.json`, so a relaunch neither pays for the timing again
nor switches mid-run (XLA changes the numerics slightly). XLA was measured 3x
slower for the CIFAR CNN on a CPU and 1.22x faster for the float32 LM: no
single default fits every model.
"""

import os
import time

import tensorflow as tf
from absl import logging

from trainer.state.workdir import read_json

CHOICE_FILE = "jit_compile.json"
TIMED_CALLS = 5


def choose_jit(controller):
    """Settles "auto" before the first step of a launch: the workdir's stored choice,
    else a timing; every worker takes XLA if any found it faster. Returns the choice."""
    trainer = controller.trainer
    path = os.path.join(trainer.workdir, CHOICE_FILE)
    stored = read_json(path, "the jit_compile choice")
    if stored is not None:
        xla = bool(stored["jit_compile"])
        logging.info("jit_compile=%s, as chosen for this workdir before (%s).",
                     "on" if xla else "off", path)
        return controller.any_worker(xla)
    times = {False: _seconds_per_call(trainer, False)}
    try:
        times[True] = _seconds_per_call(trainer, True)
    except tf.errors.OpError as e:  # e.g. an op XLA cannot compile (under op determinism)
        logging.info("jit_compile=auto: XLA cannot compile this model's pass here (%s).",
                     str(e).strip().splitlines()[0][:200])
        times[True] = None
    # Every worker runs the same program: XLA if any worker found it faster.
    xla = controller.any_worker(times[True] is not None and times[True] < times[False])
    logging.info("jit_compile=auto: the forward and backward pass takes %s with XLA, "
                 "%.2f ms without: jit_compile=%s (stored in %s).",
                 "-" if times[True] is None else f"{1e3 * times[True]:.2f} ms",
                 1e3 * times[False], "on" if xla else "off", path)
    controller.files.write_json(path, {"jit_compile": xla, "seconds_per_call": {
        "xla": times[True], "no_xla": times[False]}})
    return xla


def _seconds_per_call(trainer, xla):
    """The median time of the forward and backward pass on one batch, after compiling,
    with every model variable put back as it was (the pass moves BatchNormalization
    statistics)."""
    strategy = trainer.strategy
    micro_batches = strategy.distribute_datasets_from_function(  # what one pass sees
        lambda context: trainer.task.build_inputs("train", context, 0))
    features, labels = next(iter(micro_batches))
    saved = [v.numpy() for v in trainer.model.variables]
    passes = trainer.forward_backward(xla)  # as the train step will run it
    run = tf.function(lambda f, l: strategy.run(  # as train_step calls it, per replica
        lambda *batch: passes(*batch, tf.constant(False))[1], args=(f, l)))
    try:
        times = []
        for _ in range(TIMED_CALLS + 1):  # the first compiles
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), strategy.experimental_local_results(
                run(features, labels)))
            times.append(time.perf_counter() - start)
    finally:
        for variable, value in zip(trainer.model.variables, saved):
            variable.assign(value)
    return sorted(times[1:])[TIMED_CALLS // 2]
