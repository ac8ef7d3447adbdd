"""Where the time went: the goodput ledger over launches, the step-time breakdown."""

import json
import os
import subprocess
import sys
import time
import types

import pytest

from support import ROOT, build, scalars, tiny_config
from trainer.modes.train import controller as Controller
from trainer.loop import goodput
from trainer.loop.action import Action
from trainer.loop.goodput import BUCKETS, LEDGER, Ledger, account


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
    # The buckets tile the wall time from the first launch to the end of the last (to
    # the rounding of each to the millisecond): a second counted twice shows.
    total = report["productive_seconds"] + sum(badput.values())
    assert total == pytest.approx(report["wall_seconds"], abs=0.01)
    events = [json.loads(line) for line in open(tmp_path / LEDGER)]
    assert [e["event"] for e in events].count("start") == 2
    assert events[-1]["event"] == "end" and events[-1]["step"] == 30
    assert report["wall_seconds"] == pytest.approx(
        events[-1]["time"] - events[0]["process_start"], abs=0.01)
    assert report["goodput"] == pytest.approx(  # (of the unrounded seconds)
        report["productive_seconds"] / report["wall_seconds"], abs=2e-4)
    assert scalars(tmp_path, "train")["goodput/goodput"][-1] == (30, pytest.approx(
        report["goodput"], abs=1e-4))


def _launch(process_start, step, chunks, end=True):
    """One launch's events: 2 s to its loop (0.5 s of it the restore of `step`), then
    `chunks` chunks of 5 steps at 0.1 s a step (the first 1 s longer: the compile), each
    with 0.05 s of input wait and 0.1 s of host work, and an end unless killed."""
    t = process_start + 2.0
    events = [dict(event="start", time=t, process_start=process_start, step=step,
                   restore_seconds=0.5)]
    for i in range(chunks):
        step, train = step + 5, (1.55 if i == 0 else 0.55)
        t = round(t + train + 0.1, 4)
        events.append(dict(event="cycle", time=t, step=step, steps=5,
                           seconds={"train": train, "input_wait": 0.05}))
    return events + [dict(event="end", time=t + 0.2, step=step, stopped="done")] * end


def _append(workdir, launch, monkeypatch):
    """Appends `launch` through a Ledger, as the Controller does, at its events' times."""
    times = iter(e["time"] for e in launch)
    monkeypatch.setattr(goodput, "time", types.SimpleNamespace(time=lambda: next(times)))
    ledger, totals = Ledger(str(workdir), is_chief=True), {}
    start = launch[0]
    ledger.start(start["process_start"], start["step"], start["restore_seconds"], totals)
    for e in launch[1:]:
        if e["event"] == "cycle":
            totals = {k: totals.get(k, 0.0) + v for k, v in e["seconds"].items()}
            ledger.cycle(e["step"], e["steps"], totals)
    if launch[-1]["event"] == "end":
        ledger.end(launch[-1]["step"], launch[-1]["stopped"])


def _tiles(report):
    """Whether the buckets add up to the wall time, to the rounding of each."""
    total = report["productive_seconds"] + sum(report["badput_seconds"].values())
    return abs(total - report["wall_seconds"]) <= 0.006


def test_an_event_cut_by_a_kill_costs_only_itself(tmp_path, monkeypatch):
    """Killed at step 27 (checkpoint 10) while appending the cycle to 25; relaunched."""
    first, second = _launch(1000.0, 0, 5, end=False), _launch(1020.0, 10, 4)
    clean, cut = tmp_path / "clean", tmp_path / "cut"
    clean.mkdir(), cut.mkdir()
    _append(clean, first[:-1], monkeypatch)  # the same, without the cut event
    _append(clean, second, monkeypatch)
    _append(cut, first, monkeypatch)
    text = (cut / LEDGER).read_text()
    (cut / LEDGER).write_text(text[:-25])  # cut inside the last event, newline and all
    _append(cut, second, monkeypatch)
    expected = account(Ledger(str(clean), False).read())
    assert expected["launches"] == 2 and expected["steps_redone"] == 10  # 11..20 again
    assert account(Ledger(str(cut), False).read()) == expected
    lines = (cut / LEDGER).read_text().splitlines()
    assert json.loads(lines[len(first)])["event"] == "start"  # on a line of its own
    # A ledger an earlier version wrote, the start appended to the cut line, reads so too.
    joined = text[:-25] + "".join(l + "\n" for l in lines[len(first):])
    (cut / LEDGER).write_text(joined)
    assert account(Ledger(str(cut), False).read()) == expected


def test_a_clock_that_steps_back_between_launches_times_each_launch_on_its_own(tmp_path):
    """The second launch (another host, or after an NTP step) reads 1 h before the first."""
    first, second = _launch(1000.0, 0, 5, end=False), _launch(1000.0 - 3600, 10, 4)
    report = account(first + second)
    durations = (first[-1]["time"] - 1000.0) + (second[-1]["time"] - (1000.0 - 3600))
    assert report["wall_seconds"] == pytest.approx(durations, abs=1e-3)
    assert report["badput_seconds"]["idle"] == 0 and _tiles(report)
    assert report["goodput"] == pytest.approx(
        report["productive_seconds"] / report["wall_seconds"], abs=1e-4)
    # with the clocks agreeing, the wall time runs from the first start to the last end
    later = _launch(first[-1]["time"] + 3.0, 10, 4)
    report = account(first + later)
    assert report["wall_seconds"] == pytest.approx(later[-1]["time"] - 1000.0, abs=1e-3)
    assert report["badput_seconds"]["idle"] == pytest.approx(3.0) and _tiles(report)


def test_a_chunk_that_traced_the_loop_again_counts_as_compile():
    """After the jit choice switched XLA on, the next chunk traces and compiles: beyond
    its steps at the launch's pace it is compile time, and it does not set the pace."""
    events = _launch(1000.0, 0, 4)
    events[2]["seconds"]["train"] += 2.0  # the second chunk, 2 s of tracing
    events[2]["traced"] = True
    for e in events[3:]:
        e["time"] += 2.0
    report = account(events)
    assert report["badput_seconds"]["compile"] == pytest.approx(3.0, abs=1e-3)  # 1 + 2
    assert report["productive_seconds"] == pytest.approx(4 * 5 * 0.1, abs=1e-3)
    assert _tiles(report)


# Its own process: op determinism, which another test may have turned on for good in
# this one, refuses the clock that times the input.
SLOW_INPUT_RUN = """
import sys, time
import tensorflow as tf
from absl import logging
from support import build, tiny_config
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


@pytest.mark.e2e
def test_an_input_bound_run_is_named_in_the_log_and_the_breakdown(tmp_path):
    run = subprocess.run([sys.executable, "-c", SLOW_INPUT_RUN, str(tmp_path)],
                         cwd=os.path.join(ROOT, "tests"),
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(l for l in run.stderr.splitlines() if "step 30/30" in l)
    assert "input-bound: " in line and "% waiting on data" in line
    assert "(remedy: batches are gathered from memory" in line  # the task's own remedy
    last = {tag[5:]: values[-1] for tag, values in scalars(tmp_path, "train").items()
            if tag.startswith("time/")}  # the interval 20..30, compiled long before
    assert {step for step, _ in last.values()} == {30}
    assert max(last, key=lambda k: last[k][1]) == "input_wait"
    shares = json.load(open(tmp_path / "summary.json"))["time_breakdown"]
    assert set(shares) == set(last) and shares["input_wait"] > 0.3
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
