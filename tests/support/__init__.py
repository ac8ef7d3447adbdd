"""What the tests share: small configs, a Trainer as launch.py builds one, two replicas,
the run's checkpoints and TensorBoard scalars read back, a kill-and-relaunch comparison.
The modules beside this one hold the rest (tiny image sets, an LM config, test tasks, the
scripts of the worker processes).

Importing it sets the process up as the suite runs (tests/conftest.py imports it first,
and so does a process a test starts that imports it): the repository on sys.path, a user
cache of the suite's own, and two logical CPU devices, for MirroredStrategy tests."""

import functools
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository's root: where launch.py, configs/ and trainer/ are."""

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The user cache (the CPU peak for MFU, jit_compile timings) of the suite's own, out of the
# user's (subprocesses inherit the variable).
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tftrainer-tests-cache-")
sys.path.insert(0, ROOT)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from configs import cifar  # noqa: E402
from trainer.task import get_task  # noqa: E402
from trainer import Trainer  # noqa: E402
from trainer.runtime.precision import set_policy  # noqa: E402
from trainer.runtime import user_cache  # noqa: E402
from trainer.runtime.host import cores, cpu_name  # noqa: E402
from trainer.step.flops import PEAK_CACHE  # noqa: E402

# A stand-in CPU peak: the suite's MFU figures are not measurements, and a peak timed
# while the other test process keeps the cores busy is not kept (trainer/step/flops.py),
# so it would be timed again in every process. test_flops.py times it in caches of its own.
for _dtype in ("float32", "bfloat16", "float16"):
    user_cache.store(PEAK_CACHE, f"{cpu_name()}, {cores()} cores, {_dtype}", 1e12)


@functools.lru_cache(maxsize=None)
def two_replicas():
    """One MirroredStrategy for the whole session: separate instances in one process
    reuse collective instance keys, and a later one then trips over an earlier one's
    shapes ("Shape mismatch in the collective instance")."""
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def tiny_config(**overrides):
    """configs/cifar.py shrunk to seconds: synthetic data, small batches, few steps."""
    c = cifar.get_config()
    c.data.source = "synthetic"
    c.data.synthetic_train_size = 1024
    c.data.synthetic_test_size = 200
    c.data.global_batch_size = 32
    c.precision = "float32"
    c.distribution.strategy = "default"
    c.trainer.update(train_steps=20, steps_per_loop=5, log_every=5, eval_every=10,
                     checkpoint_every=10, per_step_summaries=False,  # train/ at log_every
                     jit_compile="off")  # not timed: runs compared bitwise run alike
    return override(c, **overrides)


def override(config, **overrides):
    """Sets dotted fields, e.g. override(c, **{"trainer.train_steps": 5})."""
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


def build(config, workdir, strategy=None):
    """A Trainer as launch.py makes one: precision policy set, seeded."""
    strategy = strategy or tf.distribute.get_strategy()
    set_policy(config.precision, strategy)
    keras.utils.set_random_seed(config.seed)
    return Trainer(config, get_task(config), strategy, str(workdir))


def checkpoint_steps(directory):
    """The steps of the checkpoints a CheckpointManager keeps in `directory`."""
    state = tf.train.get_checkpoint_state(str(directory))
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths] if state else []


def kill_relaunch_and_compare(launch_args, tmp_path):
    """Runs `launch.py launch_args` (30 steps, checkpoints every 10, deterministic) twice
    side by side; SIGKILLs one after its step 15 (ckpt-10 complete), relaunches it, and
    asserts both ckpt-30 bitwise equal. Returns the relaunch's stderr."""
    args = [sys.executable, "launch.py", *launch_args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # (deterministic ops: sharing the cores changes no value)
    whole = subprocess.Popen(args + [f"--workdir={tmp_path / 'whole'}"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = subprocess.Popen(args + [f"--workdir={tmp_path / 'killed'}"], cwd=ROOT, env=env,
                              stderr=subprocess.PIPE, text=True)
    for line in killed.stderr:
        if "step 15/30" in line:  # steps after the newest checkpoint will be lost
            break
    deadline = time.monotonic() + 60  # (ckpt-10 may be written asynchronously)
    while 10 not in checkpoint_steps(tmp_path / "killed" / "checkpoints"):
        assert time.monotonic() < deadline, "ckpt-10 never completed"
        time.sleep(0.05)
    killed.kill()
    killed.wait(timeout=60)
    assert 30 not in checkpoint_steps(tmp_path / "killed" / "checkpoints")
    whole_log = whole.communicate(timeout=300)[1]
    assert whole.returncode == 0, whole_log[-2000:]
    resumed = subprocess.run(args + [f"--workdir={tmp_path / 'killed'}"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Restored" in resumed.stderr and "step 30/30" in resumed.stderr
    a = tf.train.load_checkpoint(str(tmp_path / "whole" / "checkpoints" / "ckpt-30"))
    b = tf.train.load_checkpoint(str(tmp_path / "killed" / "checkpoints" / "ckpt-30"))
    names = list(a.get_variable_to_shape_map())
    assert len(names) > 10
    for name in names:
        np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name), err_msg=name)
    return resumed.stderr


def scalars(workdir, run):
    """{tag: [(step, value)]} read back from the TensorBoard event files."""
    out = {}
    for path in tf.io.gfile.glob(os.path.join(str(workdir), run, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "scalars":
                    out.setdefault(v.tag, []).append(
                        (event.step, float(tf.make_ndarray(v.tensor))))
    return out
