"""--mode=find_batch_size: the largest global batch whose train step runs.

Doubling from `find_batch_size.start` (0: the config's batch) until a trial
fails, then a binary search between the last batch that ran and the first that
did not, over multiples of `multiple_of` and of the replicas. A trial builds
the Trainer at that batch and runs `steps_per_trial` compiled steps. It fails
on `tf.errors.ResourceExhaustedError` (out of memory on a GPU or TPU), when the
peak of TensorFlow's allocator on any replica's device (on a CPU, whose allocator
keeps no statistics, the growth of the process's peak resident memory) passes
`memory_budget_gb`, or when the data set is smaller than the batch. On a CPU an
allocation fails only when the whole machine runs out (the kernel then kills the
process, and others with it), so there a budget of 0 means half the memory
available at start, and a trial whose peak, scaled from the largest batch that
ran, would pass the budget is not run but counted as failing. At most
`max_trials` trials, each in the run's precision
policy and float32 overrides. Writes `workdir/find_batch_size.json` and prints
the override; no checkpoint is read or written.
"""

import copy
import gc
import math
import os

import keras
import tensorflow as tf
from absl import logging

from trainer.runtime.distribute import is_chief
from trainer.runtime.host import available_memory_bytes
from trainer.runtime.precision import set_policy
from trainer.runtime.settings import check_number
from trainer.state.workdir import ChiefFiles
from trainer.step.trainer import Trainer
from trainer.task import get_task


def check_find_batch_size(f):
    for name, minimum in (("start", 0), ("max_trials", 1), ("steps_per_trial", 1),
                          ("multiple_of", 1)):
        value = f[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"find_batch_size.{name}={value!r} must be an integer >= "
                             f"{minimum}.")
    check_number(f.memory_budget_gb, "find_batch_size.memory_budget_gb",
                 "0: none on a GPU or TPU, half the available memory on a CPU")


def run(config, strategy, workdir, summary):
    set_policy(config.precision, strategy)
    find_batch_size(config, strategy, workdir, get_task)


def find_batch_size(config, strategy, workdir, make_task):
    """Runs the search; returns the report written to `workdir/find_batch_size.json`."""
    f = config.find_batch_size
    check_find_batch_size(f)
    step = math.lcm(f.multiple_of, strategy.num_replicas_in_sync)
    batch = max(round((f.start or config.data.global_batch_size) / step), 1) * step
    budget_gb, budget_source = memory_budget(f.memory_budget_gb, strategy)
    logging.info("find_batch_size: memory budget %s.", budget_source)
    policy = keras.mixed_precision.global_policy().name  # clear_session resets it
    trials, good, bad = [], None, None
    while len(trials) < f.max_trials:
        keras.mixed_precision.set_global_policy(policy)
        trial = (_predicted_past_budget(trials, good, batch, budget_gb)
                 or _trial(config, strategy, workdir, make_task, batch, budget_gb))
        trials.append(trial)
        logging.info("find_batch_size: batch %d %s", batch,
                     "runs" if trial["runs"] else f"fails: {trial['reason']}")
        if trial["runs"]:
            good = batch
        else:
            bad = batch
        if bad is None:
            batch *= 2
        elif good is None:
            if batch == step:
                break
            batch = max(batch // 2 // step * step, step)  # down until one runs
        elif bad - good <= step:
            break
        else:
            batch = (good + bad) // 2 // step * step
    keras.mixed_precision.set_global_policy(policy)
    report = {"largest": good, "first_failing": bad, "multiple_of": step,
              "memory_budget_gb": budget_gb, "memory_budget": budget_source,
              "precision": policy, "trials": trials}
    ChiefFiles(is_chief(strategy)).write_json(
        os.path.join(workdir, "find_batch_size.json"), report)
    if good is None:
        raise RuntimeError(f"find_batch_size: no batch down to {step} runs "
                           f"({trials[-1]['reason']}); lower find_batch_size.multiple_of or "
                           "raise memory_budget_gb.")
    bound = (f"{bad} did not" if bad is not None else
             f"no failure within find_batch_size.max_trials={f.max_trials}: larger ones may run")
    print(f"find_batch_size: the largest batch that runs is {good} ({bound}; memory "
          f"budget {budget_source}). Use:\n  --config.data.global_batch_size={good}\n(a larger "
          "batch may want another learning rate: --mode=find_lr with it tells.)")
    return report


def memory_budget(configured_gb, strategy):
    """(The budget in GB, or 0 for none; where it comes from): the configured one, else
    on a CPU half the memory available now."""
    if configured_gb:
        return configured_gb, f"{configured_gb:g} GB (find_batch_size.memory_budget_gb)"
    if tf.config.list_physical_devices("GPU") or isinstance(strategy,
                                                            tf.distribute.TPUStrategy):
        return 0.0, "none (the device's own memory bounds it)"
    available = available_memory_bytes()
    if available is None:
        raise ValueError("find_batch_size on a CPU needs a memory budget, and the memory "
                         "available here is unknown: set --config.find_batch_size."
                         "memory_budget_gb.")
    budget = available / 2 / 2**30
    return budget, (f"{budget:.3g} GB, half of the {available / 2**30:.3g} GB available at start "
                    "(a CPU has no out-of-memory error; set find_batch_size.memory_budget_gb "
                    "to change it)")


def _predicted_past_budget(trials, good, batch, budget_gb):
    """A failed trial, not run, if the peak of the largest batch that ran, scaled by the
    batch, passes the budget: on a CPU such a trial could take the machine's memory
    before its own peak is measured. (Linear in the batch, with no fixed part: it
    over-estimates, never under.)"""
    if not budget_gb or good is None:
        return None
    peak = next(t["peak_bytes"] for t in trials if t["batch"] == good and t["runs"])
    predicted = peak * batch / good
    if predicted <= budget_gb * 2**30:
        return None
    return {"batch": batch, "runs": False, "peak_bytes": None,
            "reason": f"not run: its peak would be about {predicted / 2**30:.3g} GB (batch "
                      f"{good}'s {peak / 2**30:.3g} GB, scaled) > find_batch_size."
                      f"memory_budget_gb={budget_gb:.3g}"}


def _trial(config, strategy, workdir, make_task, batch, budget_gb):
    """Builds the Trainer at `batch` and runs `steps_per_trial` steps: {"batch", "runs",
    "peak_bytes", "reason"}."""
    f = config.find_batch_size
    c = copy.deepcopy(config)
    c.data.global_batch_size = batch
    c.trainer.update(per_step_summaries=False, train_steps=f.steps_per_trial)
    c.optimizer.update(schedule="constant", warmup_steps=0)  # no schedule in 2 steps
    devices = _replica_devices(strategy)
    result = {"batch": batch, "runs": False, "peak_bytes": None, "reason": None}
    trainer = None
    try:
        keras.utils.set_random_seed(c.seed)
        trainer = Trainer(c, make_task(c), strategy, workdir)
        start = _reset_peak(devices)
        iterator = iter(trainer.distributed_dataset("train"))
        trainer.train_loop(iterator, tf.constant(f.steps_per_trial, tf.int64))
        trainer.step.numpy()  # waits for the steps
        peak = _peak(devices, start)
        result["peak_bytes"] = peak
        if budget_gb and peak > budget_gb * 2**30:
            result["reason"] = (f"peak memory {peak / 2**30:.3g} GB > find_batch_size."
                                f"memory_budget_gb={budget_gb:.3g}")
        else:
            result["runs"] = True
    except tf.errors.ResourceExhaustedError as e:
        result["reason"] = f"out of memory ({str(e).strip().splitlines()[0][:200]})"
    except ValueError as e:
        if "global_batch_size" not in str(e):
            raise
        result["reason"] = str(e).strip().splitlines()[0][:200]  # the data set is smaller
    finally:
        del trainer
        keras.backend.clear_session()  # free the trial's model and traces
        gc.collect()
    return result


def _reset_peak(devices):
    """Starts a trial's peak (see `_peak`); returns the process's resident bytes then."""
    if not all(d.startswith("CPU") for d in devices):
        for device in devices:
            tf.config.experimental.reset_memory_stats(device)
        return 0
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident set size := the current one
    except OSError as e:
        raise RuntimeError(
            f"find_batch_size on a CPU measures the process's peak memory through /proc "
            f"(Linux), which is not usable here ({e}); run it where it is, or on the "
            "accelerator.") from e
    return _status_bytes("VmRSS")


def _peak(devices, start):
    """The bytes a trial added at its peak: TensorFlow's allocator's peak on GPUs and
    TPUs. A CPU's allocator keeps no statistics (get_memory_info serves GPUs and TPUs
    only), so there the process's peak resident memory (VmHWM) beyond what it held at
    the start (`start`), which is what the kernel kills the process for."""
    if all(d.startswith("CPU") for d in devices):
        return max(_status_bytes("VmHWM") - start, 0)
    return max(tf.config.experimental.get_memory_info(d)["peak"] for d in devices)


def _status_bytes(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _replica_devices(strategy):
    """The replicas' devices in get_memory_info's form ("GPU:0")."""
    try:
        names = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: the first GPU, else the CPU
        gpus = tf.config.list_logical_devices("GPU")
        names = [gpus[0].name if gpus else "/device:CPU:0"]
    specs = [tf.DeviceSpec.from_string(name) for name in names]
    return [f"{spec.device_type}:{spec.device_index or 0}" for spec in specs]
