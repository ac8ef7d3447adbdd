"""`trainer.jit_compile`: XLA for the forward and backward pass, or not, chosen per model.

"on" and "off" force it; TPUs always compile. "auto" (the default) is settled by
the `JitChoice` action: from the workdir's stored choice (a relaunch neither times
again nor switches mid-run: XLA changes the numerics slightly), else from a timing
kept in the user's cache (trainer/runtime/user_cache.py) by model, batch,
precision and device, else by timing the forward and backward pass (the part
`jit_compile` changes; the all-reduce and the update are outside it) on one real
batch both ways, a few calls each after its compilation, and keeping the faster.
XLA can win on GPUs, which time it before the first step. On a CPU it lost on
every shipped model (0.05-0.48x) and its compile and timing cost seconds, so
there the run starts without it and decides at the end of its first chunk, from
that chunk's pace: only a run whose steps left take `LONG_RUN_SECONDS` times both
(a shorter run never pays a timing). The log line says what decided.
"""

import hashlib
import os
import time

import tensorflow as tf
from absl import logging

from trainer.runtime import startup
from trainer.loop.action import Action
from trainer.runtime import user_cache
from trainer.runtime.host import cores, cpu_name
from trainer.state.workdir import read_json
from trainer.step.trainer import without_autotune_thread

CHOICE_FILE = "jit_compile.json"
CACHE = "jit_compile.json"
TIMED_CALLS = 5
LONG_RUN_SECONDS = 600.0  # on a CPU, steps left worth this long are worth timing XLA


class JitChoice(Action):
    """Settles `trainer.jit_compile=auto` before the first step (`begin`) or, on a CPU
    without a stored or cached choice, at the end of the first chunk. Every worker
    makes the same collective calls in the same order and takes XLA if any chose it."""

    at_end = False

    def __init__(self):
        self.pending = False  # decided at the first boundary

    def begin(self, controller):
        trainer = controller.trainer
        path = os.path.join(trainer.workdir, CHOICE_FILE)
        stored = read_json(path, "the jit_compile choice")
        if controller.any_worker(stored is not None):  # the choice of this workdir
            xla = controller.any_worker(bool(stored and stored["jit_compile"]))
            logging.info("jit_compile=%s, as chosen for this workdir before (%s).",
                         "on" if xla else "off", path)
            _use(trainer, xla)
        else:
            self.key = cache_key(trainer)
            cached = user_cache.read(CACHE).get(self.key)
            cached = cached if isinstance(cached, dict) and isinstance(
                cached.get("jit_compile"), bool) else None
            if not controller.any_worker(cached is None):
                self._settle(controller, cached["jit_compile"], (
                    "as timed before for this model, batch, precision and device "
                    f"({cached.get('times', 'times not kept')})"), user_cache.path(CACHE))
            elif _device_type(trainer.strategy) == "CPU":
                self.pending = True
                _use(trainer, False)
                logging.info("jit_compile=auto: off for the first chunk; its pace decides "
                             "whether the run is long enough to time XLA on a CPU.")
            else:
                self._settle(controller, *_timed_choice(trainer, self.key))
        startup.mark("jit_choice")

    def should_run(self, controller, step, logs):
        return self.pending

    def __call__(self, controller, step, logs):
        """On a CPU, at the end of the first chunk: off for a short run, else timed."""
        self.pending = False
        trainer = controller.trainer
        steps = step - controller.start_step
        if steps <= 0:  # nothing trained: nothing to decide from
            return
        pace = controller.seconds["train"] / steps  # tracing included: an upper bound
        steps_left = trainer.train_steps - step
        if not controller.any_worker(steps_left * pace >= LONG_RUN_SECONDS):
            self._settle(controller, False, (
                f"the first {steps} steps took {1e3 * pace:.1f} ms each without XLA "
                f"(tracing included): {steps_left} steps left, ~{steps_left * pace:.0f} s, "
                f"too short to earn back timing XLA on a CPU (less than "
                f"{LONG_RUN_SECONDS:.0f} s; jit_compile=on forces it)"), "not timed")
        else:
            self._settle(controller, *_timed_choice(trainer, self.key))

    @staticmethod
    def _settle(controller, xla, why, stored_in):
        """Takes XLA if any worker chose it, logs why and stores it for the relaunches."""
        trainer = controller.trainer
        xla = controller.any_worker(xla)
        path = os.path.join(trainer.workdir, CHOICE_FILE)
        logging.info("jit_compile=auto: jit_compile=%s, %s (stored in %s; %s).",
                     "on" if xla else "off", why, path, stored_in)
        controller.files.write_json(path, {"jit_compile": xla, "why": why})
        _use(trainer, xla)


def _use(trainer, xla):
    """Sets the choice; the train loop is traced again only if it changes."""
    if trainer.jit_compile is not xla:
        trainer.use_jit(xla)


def _timed_choice(trainer, key):
    """(XLA or not, why, where the timing is kept) from timing the pass both ways."""
    no_xla = _seconds_per_call(trainer, False)
    try:
        xla = _seconds_per_call(trainer, True)
    except tf.errors.OpError as e:  # e.g. an op XLA cannot compile (under op determinism)
        return False, ("XLA cannot compile this model's pass here: "
                       f"{str(e).strip().splitlines()[0][:200]}"), "not cached"
    times = f"{1e3 * xla:.2f} ms with XLA, {1e3 * no_xla:.2f} ms without"
    kept = user_cache.store(CACHE, key, {"jit_compile": xla < no_xla, "times": times})
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
        lambda *batch: passes(*batch, tf.constant(False))[1], args=(f, l)), autograph=False)
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
