"""Where the time went: the goodput ledger over launches, the step-time breakdown."""

import json
import time

import pytest
import tensorflow as tf

from conftest import build, scalars, tiny_config
from trainer.actions import Action
from trainer.controller import Controller
from trainer.goodput import BUCKETS, LEDGER


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
    assert report["goodput"] == pytest.approx(
        report["productive_seconds"] / report["wall_seconds"], abs=1e-3)
    assert scalars(tmp_path, "train")["goodput/goodput"][-1] == (30, pytest.approx(
        report["goodput"], abs=1e-4))


def test_an_input_bound_run_is_named_in_the_log_and_the_breakdown(tmp_path, caplog):
    caplog.set_level("INFO")
    config = tiny_config(**{"trainer.train_steps": 20, "trainer.steps_per_loop": 5,
                            "trainer.log_every": 10, "trainer.eval_every": 0})
    trainer = build(config, tmp_path)
    build_inputs = trainer.task.build_inputs

    def slow(split, context, start):  # 50 ms per training batch, nothing ahead
        def sleep(x):
            time.sleep(0.05)
            return x
        return build_inputs(split, context, start).map(lambda f, l: (tf.ensure_shape(
            tf.numpy_function(sleep, [f], f.dtype, stateful=True), f.shape), l))

    trainer.task.build_inputs = slow
    trainer.train(evaluate=False)
    line = next(r.getMessage() for r in caplog.records if "step 20/20" in r.getMessage())
    assert "input-bound: " in line and "% waiting on data" in line
    shares = json.load(open(tmp_path / "summary.json"))["time_breakdown"]
    assert shares["input_wait"] > 0.4 and shares["input_wait"] > shares["step"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
    logged = scalars(tmp_path, "train")
    assert logged["time/input_wait"][-1][1] > 0.4  # the interval 10..20: all steady state
