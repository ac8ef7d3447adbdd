"""Where the time went: the goodput ledger over launches, the step-time breakdown."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import build, scalars, tiny_config
from trainer.assemble import controller as Controller
from trainer.loop.actions import Action
from trainer.loop.goodput import BUCKETS, LEDGER

HERE = os.path.dirname(os.path.abspath(__file__))


class _KillAt(Action):
    """Dies at `every` like a SIGKILL: no checkpoint, no summary, no ledger end."""

    def __init__(self, every):
        self.every = every

    def __call__(self, controller, step, logs):
        raise KeyboardInterrupt(f"killed at step {step}")


def test_goodput_adds_up_over_a_kill_and_a_relaunch_and_counts_the_redone_steps(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 30, "trainer.steps_per_loop": 5,
                            "trainer.checkpoint_every": 10, "trainer.eval_every": 10})
    first = build(config, tmp_path)
    with pytest.raises(KeyboardInterrupt):  # at 17: checkpoint 10, steps to 15 logged
        Controller(first, actions=[_KillAt(17)]).train()
    time.sleep(0.5)  # the scheduler's delay before the relaunch
    build(config, tmp_path).train()

    summary = json.load(open(tmp_path / "summary.json"))
    report = summary["goodput"]
    assert report["launches"] == 2 and report["steps_redone"] == 5  # 11..15, run twice
    badput = report["badput_seconds"]
    assert set(badput) == set(BUCKETS)
    assert badput["redone"] > 0 and badput["idle"] >= 0.5
    assert badput["evaluation"] > 0 and badput["checkpoint_save"] > 0
    assert badput["checkpoint_restore"] > 0 and badput["compile"] > 0
    assert all(v >= 0 for v in badput.values())
    # The buckets tile the wall time from the first launch to the end of the last.
    total = report["productive_seconds"] + sum(badput.values())
    assert total == pytest.approx(report["wall_seconds"], rel=0.02)
    events = [json.loads(line) for line in open(tmp_path / LEDGER)]
    assert [e["event"] for e in events].count("start") == 2
    assert events[-1]["event"] == "end" and events[-1]["step"] == 30
    assert report["wall_seconds"] == pytest.approx(
        events[-1]["time"] - events[0]["process_start"], abs=0.01)
    assert report["goodput"] == pytest.approx(  # (of the unrounded seconds)
        report["productive_seconds"] / report["wall_seconds"], rel=0.02)
    assert scalars(tmp_path, "train")["goodput/goodput"][-1] == (30, pytest.approx(
        report["goodput"], abs=1e-4))


# Its own process: op determinism, which another test may have turned on for good in
# this one, refuses the clock that times the input.
SLOW_INPUT_RUN = """
import sys, time
import tensorflow as tf
from absl import logging
from conftest import build, tiny_config
logging.set_verbosity("info")
config = tiny_config(**{"trainer.train_steps": 30, "trainer.steps_per_loop": 5,
                        "trainer.log_every": 10, "trainer.eval_every": 0,
                        "trainer.checkpoint_every": 0})
trainer = build(config, sys.argv[1])
build_inputs = trainer.task.build_inputs

def slow(split, context, start):  # 100 ms per training batch, nothing read ahead
    def sleep(x):
        time.sleep(0.1)
        return x
    return build_inputs(split, context, start).map(lambda f, l: (tf.ensure_shape(
        tf.numpy_function(sleep, [f], f.dtype, stateful=True), f.shape), l))

trainer.task.build_inputs = slow
trainer.train(evaluate=False)
"""


def test_an_input_bound_run_is_named_in_the_log_and_the_breakdown(tmp_path):
    run = subprocess.run([sys.executable, "-c", SLOW_INPUT_RUN, str(tmp_path)], cwd=HERE,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(l for l in run.stderr.splitlines() if "step 30/30" in l)
    assert "input-bound: " in line and "% waiting on data" in line
    last = {tag[5:]: values[-1] for tag, values in scalars(tmp_path, "train").items()
            if tag.startswith("time/")}  # the interval 20..30, compiled long before
    assert {step for step, _ in last.values()} == {30}
    assert max(last, key=lambda k: last[k][1]) == "input_wait"
    shares = json.load(open(tmp_path / "summary.json"))["time_breakdown"]
    assert set(shares) == set(last) and shares["input_wait"] > 0.3
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
