"""Model FLOPs per training step, the hardware's peak, and MFU (model FLOPs utilization).

Model FLOPs are what the model needs, not what the hardware ran: recomputation
(remat) is not counted. A Task may count them itself (`Task.flops_per_example`:
the transformer tasks use 6 x matmul parameters x tokens plus attention, causal
attention at half, MaxText's convention). Otherwise they are counted on the
model's forward graph for one example: TensorFlow's profiler counts its
float operations (matmuls, convolutions, element-wise ops) and we add its
einsums (which the profiler does not count); forward plus backward is 3 times
that.

Peak: per device, from the table below for known accelerators (dense, no
sparsity), or `trainer.peak_tflops`; on a CPU, a square matmul in the run's
compute dtype, timed once per machine and kept in the user's cache (all of the
process's CPU devices share those cores, so the CPU's peak is not multiplied by
the replicas).
"""

import functools
import math
import os
import re
import time

import tensorflow as tf
from absl import logging

from trainer.runtime import user_cache
from trainer.runtime.host import cores, cpu_name

PEAK_CACHE = "cpu_peak.json"

# Dense peak TFLOP/s per chip: NVIDIA A100 / H100 / H200 SXM datasheets (float32 matmuls
# run as TF32, TensorFlow's default on these GPUs), Google Cloud TPU system architecture
# pages (v4, v5e, v5p; bfloat16).
PEAK_TFLOPS = {
    "a100": {"bfloat16": 312, "float16": 312, "float32": 156},
    "h100": {"bfloat16": 989, "float16": 989, "float32": 494},
    "h200": {"bfloat16": 989, "float16": 989, "float32": 494},
    "v4": {"bfloat16": 275},
    "v5litepod": {"bfloat16": 197},
    "v5e": {"bfloat16": 197},
    "v5p": {"bfloat16": 459},
}


def forward_flops(model, example_spec):
    """Float operations of `model`'s forward pass on one example (`example_spec`: the
    features' TensorSpecs, batch dimension 1)."""
    graph = tf.function(lambda f: model(f, training=False)).get_concrete_function(
        example_spec).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    tf_logger = tf.get_logger()
    tf_logger.addFilter(_not_profiler_noise)
    try:
        counted = tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops
    finally:
        tf_logger.removeFilter(_not_profiler_noise)
    return counted + sum(_einsum_flops(op) for op in graph.get_operations()
                         if op.type == "Einsum")


def _not_profiler_noise(record):
    """False for the deprecation warning the v1 profiler's own code logs in every run:
    nothing a user can act on."""
    return "tensor_shape_from_node_def_name" not in record.getMessage()


def _einsum_flops(op):
    """2 x the product of every index's size (multiply and add per term)."""
    inputs = op.get_attr("equation").decode().split("->")[0].split(",")
    sizes = {}
    for letters, tensor in zip(inputs, op.inputs):
        for letter, size in zip(letters, tensor.shape):
            sizes[letter] = size
    return 2 * math.prod(sizes.values()) if None not in sizes.values() else 0


def train_flops_per_example(task, model, example_spec):
    """(FLOPs of one example's forward and backward pass, how they were counted)."""
    analytic = task.flops_per_example()
    if analytic:
        return analytic, "analytic (the task's count)"
    return 3 * forward_flops(model, example_spec), "forward graph x 3"


def cpu_peak(dtype):
    """(FLOP/s of a square matmul in `dtype` on this CPU, where the figure comes from).
    Measured once per machine (CPU model, cores) and dtype, then read from the user's
    cache (trainer/runtime/user_cache.py): a timing in every run moved MFU 3x from
    run to run. A timing while other processes had the CPU reads low (half, with one
    of two cores taken) and is not kept."""
    key = f"{cpu_name()}, {cores()} cores, {dtype}"
    cached = user_cache.read(PEAK_CACHE).get(key)
    if isinstance(cached, float) and cached > 0:
        return cached, f"{dtype} matmul on this CPU, read from {user_cache.path(PEAK_CACHE)}"
    peak, others = _matmul_flops(dtype)
    if others > 0.1:
        return peak, (f"{dtype} matmul on this CPU, measured now, not cached: other "
                      f"processes had {others:.0%} of the CPU meanwhile")
    return peak, f"{dtype} matmul on this CPU, measured now, {user_cache.store(PEAK_CACHE, key, peak)}"


@functools.lru_cache(maxsize=None)
def _matmul_flops(dtype, size=2048, seconds=0.5):
    """(FLOP/s of a square matmul in `dtype`, the share of the CPU other processes had
    meanwhile): the best of 3 to 20 timings over about `seconds`, after two calls that
    trace and warm up (thread pools, caches, clocks), large enough that call overheads
    do not count."""
    a = tf.cast(tf.random.stateless_normal([size, size], [0, 0]), dtype)
    matmul = tf.function(lambda x: tf.matmul(x, x))
    for _ in range(2):
        matmul(a)[0, 0].numpy()
    best, trials, began, cpu = math.inf, 0, time.perf_counter(), _cpu_seconds()
    while trials < 3 or (trials < 20 and time.perf_counter() - began < seconds):
        start = time.perf_counter()
        matmul(a)[0, 0].numpy()
        best, trials = min(best, time.perf_counter() - start), trials + 1
    used = [after - before for before, after in zip(cpu, _cpu_seconds())]
    others = (used[0] - used[1]) / ((time.perf_counter() - began) * cores())
    return 2 * size**3 / best, max(others, 0.0)


def _cpu_seconds():
    """(CPU seconds all processes have run, this process's); all as this process's where
    /proc/stat is missing (not Linux)."""
    mine = time.process_time()
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:9]]  # user .. steal
    except (OSError, ValueError):
        return mine, mine
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"), mine  # not idle


def peak_flops(strategy, compute_dtype, override_tflops=0.0):
    """(Peak FLOP/s of the devices the step runs on, where the figure comes from), or
    (None, why not) for an accelerator the table does not know."""
    replicas = strategy.num_replicas_in_sync
    if override_tflops:
        return override_tflops * 1e12 * replicas, "trainer.peak_tflops"
    gpus = tf.config.list_physical_devices("GPU")
    tpu = os.environ.get("TPU_ACCELERATOR_TYPE", "")  # e.g. v4-8, v5litepod-16
    if isinstance(strategy, tf.distribute.TPUStrategy) or gpus:
        name = (tpu.split("-")[0] if tpu else
                tf.config.experimental.get_device_details(gpus[0]).get("device_name", ""))
        kind = next((k for k in PEAK_TFLOPS if re.search(rf"\b{k}\b", name.lower())), None)
        peak = PEAK_TFLOPS.get(kind, {}).get(compute_dtype)
        if not peak:
            return None, (f"no peak known for {name or 'this accelerator'} in {compute_dtype}; "
                          "set --config.trainer.peak_tflops (per device)")
        return peak * 1e12 * replicas, f"{kind} datasheet, {compute_dtype}"
    return cpu_peak(compute_dtype)


class Utilization:
    """Model FLOPs per step and MFU of a Trainer's run, counted once, when first asked
    (after the step was traced: it records one example's features spec)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.count_seconds = None  # what counting took, once counted

    @functools.cached_property
    def counted(self):
        """(model FLOPs per optimizer step, peak FLOP/s or None)."""
        t = self.trainer
        start = time.perf_counter()
        per_example, method = train_flops_per_example(t.task, t.model, t.example_spec)
        peak, source = peak_flops(t.strategy, t.model.compute_dtype,
                                  t.config.trainer.peak_tflops)
        self.count_seconds = round(time.perf_counter() - start, 3)
        logging.info("Model FLOPs per step: %.4g (%s; %d examples); peak: %s (%s); counted "
                     "in %.2f s.", per_example * t.examples_per_step, method,
                     t.examples_per_step, "unknown" if peak is None else f"{peak:.4g} FLOP/s",
                     source, self.count_seconds)
        return per_example * t.examples_per_step, peak

    @property
    def flops_per_step(self):
        """Model FLOPs of one optimizer step; None before the step was traced, or under
        trainer.debug=eager (the count traces the model, whose Python may need eager
        tensors there, and an eager run's MFU means nothing)."""
        if self.trainer.example_spec is None or self.trainer.config.trainer.debug == "eager":
            return None
        return self.counted[0]

    def mfu(self, steps_per_sec):
        """Model FLOPs utilization at `steps_per_sec`; None without a known peak or
        before the step was traced."""
        flops_per_step = self.flops_per_step
        peak = self.counted[1] if flops_per_step is not None else None
        return None if peak is None else flops_per_step * steps_per_sec / peak
