"""`trainer.jit_compile`: XLA for the forward and backward pass, or not, chosen per model.

"on" and "off" force it; TPUs always compile. "auto" (the default) times the
forward and backward pass (the part `jit_compile` changes; the all-reduce and
the update are outside it) on one real batch both ways, a few calls each after
its compilation, and keeps the faster. XLA can win on GPUs; on a CPU it lost on
every shipped model (0.05-0.48x), and its compile and timing cost seconds, so
there it is timed only for a run long enough to earn that back
(`LONG_RUN_SECONDS` of steps without XLA). The choice is stored in
`workdir/jit_compile.json`, so a relaunch neither times again nor switches mid-run
(XLA changes the numerics slightly), and a timing in the user's cache
(trainer/runtime/user_cache.py) by model, batch, precision and device, so a new
run of the same model skips it. The log line says which of these decided.
"""

import hashlib
import os
import time

import tensorflow as tf
from absl import logging

from trainer.runtime import user_cache
from trainer.runtime.host import cores, cpu_name
from trainer.state.workdir import read_json
from trainer.step.trainer import without_autotune_thread

CHOICE_FILE = "jit_compile.json"
CACHE = "jit_compile.json"
TIMED_CALLS = 5
LONG_RUN_SECONDS = 600.0  # on a CPU, steps left worth this long are worth timing XLA


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
    key = cache_key(trainer)
    cached = user_cache.read(CACHE).get(key)
    if isinstance(cached, dict) and isinstance(cached.get("jit_compile"), bool):
        xla = cached["jit_compile"]
        why = ("as timed before for this model, batch, precision and device "
               f"({cached.get('times', 'times not kept')})")
        stored_in = user_cache.path(CACHE)
    else:
        xla, why, stored_in = _timed_choice(trainer, key, cached)
    # Every worker runs the same program: XLA if any worker chose it.
    xla = controller.any_worker(xla)
    logging.info("jit_compile=auto: jit_compile=%s, %s (stored in %s; %s).",
                 "on" if xla else "off", why, path, stored_in)
    controller.files.write_json(path, {"jit_compile": xla, "why": why})
    return xla


def _timed_choice(trainer, key, cached):
    """(XLA or not, why, where the timing is kept) from timing the pass; the time without
    XLA alone is cached too (`cached`: the user cache's entry for `key`, if any), so that
    short runs of a model time it once."""
    no_xla = (cached["no_xla_seconds"] if isinstance(cached, dict)
              and isinstance(cached.get("no_xla_seconds"), float) else None)
    kept = "timed before without XLA" if no_xla else None
    if no_xla is None:
        no_xla = _seconds_per_call(trainer, False)
        kept = user_cache.store(CACHE, key, {"no_xla_seconds": no_xla})
    steps_left = (trainer.train_steps - int(trainer.step.numpy())) * trainer.accumulation_steps
    if _device_type(trainer.strategy) == "CPU" and steps_left * no_xla < LONG_RUN_SECONDS:
        return False, (
            f"the pass takes {1e3 * no_xla:.2f} ms without XLA: {steps_left} passes left, "
            f"~{steps_left * no_xla:.0f} s, too short to earn back timing XLA on a CPU (less "
            f"than {LONG_RUN_SECONDS:.0f} s; jit_compile=on forces it)"), kept
    try:
        xla = _seconds_per_call(trainer, True)
    except tf.errors.OpError as e:  # e.g. an op XLA cannot compile (under op determinism)
        return False, ("XLA cannot compile this model's pass here: "
                       f"{str(e).strip().splitlines()[0][:200]}"), "not cached"
    times = f"{1e3 * xla:.2f} ms with XLA, {1e3 * no_xla:.2f} ms without"
    kept = user_cache.store(CACHE, key, {"jit_compile": xla < no_xla, "times": times,
                                         "no_xla_seconds": no_xla})
    return xla < no_xla, f"the pass takes {times}", kept


def cache_key(trainer):
    """What the choice depends on: the model (its variables' names, shapes and dtypes, the
    task and model settings), a replica's micro-batch (its features' specs), the
    precision policy and float32 layers, telemetry, `trainer.deterministic`, the device and
    TensorFlow's version."""
    variables = ";".join(f"{n}:{v.shape}:{v.dtype}" for n, v in trainer.variable_names.items())
    context = tf.distribute.InputContext(1, 0, trainer.strategy.num_replicas_in_sync)
    features = trainer.task.build_inputs("train", context, 0).element_spec
    c = trainer.config  # what changes the pass without changing a variable
    settings = (c.task, c.model, c.precision_overrides, c.numerics.every,
                c.trainer.deterministic)
    digest = hashlib.sha256(f"{variables}|{features}|{settings}".encode()).hexdigest()[:16]
    return (f"{type(trainer.model).__name__} {digest}, {trainer.policy}, "
            f"{_device_kind(trainer.strategy)}, TF {tf.__version__}")


def _device_type(strategy):
    """CPU, GPU or TPU: where the replicas run."""
    try:
        device = strategy.extended.worker_devices[0]
    except RuntimeError:  # the default strategy: TensorFlow's placement, a GPU if any
        return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    return tf.DeviceSpec.from_string(device).device_type or "CPU"


def _device_kind(strategy):
    """The device a replica runs on: its type and, for a CPU its model and cores, for a
    GPU its name."""
    kind = _device_type(strategy)
    if kind == "GPU":
        gpu = tf.config.list_physical_devices("GPU")[0]
        return f"GPU: {tf.config.experimental.get_device_details(gpu).get('device_name', '?')}"
    return f"{kind}: {cpu_name()}, {cores()} cores" if kind == "CPU" else kind


def _seconds_per_call(trainer, xla):
    """The median time of the forward and backward pass on one batch, after compiling,
    with every model variable put back as it was (the pass moves BatchNormalization
    statistics)."""
    strategy = trainer.strategy
    micro_batches = strategy.distribute_datasets_from_function(  # what one pass sees
        lambda context: without_autotune_thread(trainer.task.build_inputs("train", context, 0)))
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
