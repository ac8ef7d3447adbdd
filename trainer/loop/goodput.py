"""The goodput ledger: where the machine time of a run went, over all its launches.

Every launch appends to `workdir/goodput.jsonl` (JSON lines, chief only, through
tf.io.gfile): `start` (when the process started, the step restored, the
seconds the restore took), one `cycle` per compiled chunk and the actions
after it, and `end`. The events of a launch cover its time without gaps, so
summing them splits the wall time (each launch's duration on its own clock, plus
the idle time between launches) into:

    productive   train steps that moved the run forward
    startup      process start to the first step: imports, building, tracing
    compile      the chunks that traced the loop (a launch's first, and the first
                 after the jit choice switched XLA on) beyond their steps at the
                 launch's pace
    data_wait    the compiled loop waiting for the next batch
    checkpoint_save, checkpoint_restore, evaluation   (the blocking parts)
    redone       steps a killed launch had run past its last checkpoint, run again
    idle         from a launch's last event to the next launch's process start (0 when
                 the next launch's clock reads earlier: another host, an NTP step)
    other        host work: logging, summaries, the other actions, exit

Goodput is `productive` over that wall time. A SIGKILL loses what its launch
did after its last event: that time shows as `idle`, and `redone` counts the
steps it recorded past the checkpoint the next launch restored (a lower bound:
the chunk under way at the kill is not known).
"""

import json
import os
import statistics
import time

import tensorflow as tf
from absl import logging

from trainer.state.workdir import is_local

LEDGER = "goodput.jsonl"
BUCKETS = ("startup", "compile", "data_wait", "checkpoint_save", "checkpoint_restore",
           "evaluation", "redone", "idle", "other")
_IMPORTED = time.time()


_launched = False  # whether this process has started a launch already


def launch_start(trainer_created):
    """When this launch started: the process's start for its first (imports, strategy
    and model building count as startup), the Trainer's creation for a later one
    in the same process (a notebook, a test)."""
    global _launched
    first, _launched = not _launched, True
    return process_start_time() if first else trainer_created


def process_start_time():
    """This process's start (epoch seconds): from /proc on Linux, else this module's
    import."""
    try:
        with open("/proc/self/stat") as f:  # a local OS file, not the workdir
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED


class Ledger:
    """Appends this launch's events to `workdir/goodput.jsonl` (the chief's only)."""

    # On an object store (gs://) an append rewrites the object: at most one every this
    # many seconds there (a kill loses what is pending); on a local disk, every event.
    REMOTE_FLUSH_SECONDS = 30.0

    def __init__(self, workdir, is_chief):
        self.path, self.is_chief = os.path.join(workdir, LEDGER), is_chief
        self._last_time, self._last_seconds = None, None
        self._pending, self._flushed, self._failed = [], 0.0, False
        self._flush_every = 0.0 if is_local(workdir) else self.REMOTE_FLUSH_SECONDS

    def start(self, launched, step, restore_seconds, seconds, phases=None):
        """The loop of the launch that started at `launched` (epoch seconds) is about to
        start at `step`; `seconds`: the Controller's running totals by kind; `phases`:
        {phase: seconds} of the start (trainer/runtime/startup.py)."""
        if self.is_chief and not self._ends_a_line():  # a kill cut the last event short:
            self._pending.append("\n")  # without this, the start would join its line
        self._append("start", process_start=round(launched, 4), step=step,
                     restore_seconds=round(restore_seconds, 4), phases=phases or {})
        self._last_seconds = dict(seconds)

    def cycle(self, step, steps, seconds, traced=False):
        """A chunk of `steps` ending at `step` and its actions are done; `seconds`: the
        Controller's running totals by kind (train, input_wait, eval, checkpoint, ...);
        `traced`: the chunk traced and compiled the loop."""
        if self._last_seconds is None:  # not started: nothing to account for
            return
        spent = {k: round(v - self._last_seconds.get(k, 0.0), 4) for k, v in seconds.items()}
        self._last_seconds = dict(seconds)
        self._append("cycle", step=step, steps=steps, seconds=spent,
                     **({"traced": True} if traced else {}))

    def end(self, step, stopped):
        if self._last_seconds is not None:
            self._append("end", step=step, stopped=stopped)
            self._flush()

    def read(self):
        """Every event of every launch so far (an event cut by a kill is skipped)."""
        if not tf.io.gfile.exists(self.path):
            return []
        with tf.io.gfile.GFile(self.path) as f:
            return [event for line in f for event in _parse(line)]

    def _ends_a_line(self):
        """Whether the ledger is empty or ends with a newline; False when unknown (an
        empty line costs nothing)."""
        try:
            size = tf.io.gfile.stat(self.path).length
            if not size:
                return True
            with tf.io.gfile.GFile(self.path, "rb") as f:
                f.seek(size - 1)
                return f.read(1) == b"\n"
        except tf.errors.NotFoundError:
            return True
        except (tf.errors.OpError, OSError):
            return False

    def _append(self, event, **fields):
        self._last_time = time.time()
        if not self.is_chief:
            return
        self._pending.append(json.dumps(dict(event=event, time=round(self._last_time, 4),
                                             **fields)) + "\n")
        if event == "start" or self._last_time - self._flushed >= self._flush_every:
            self._flush()

    def _flush(self):
        """Appends the pending events. A failure is logged once and training goes on:
        the ledger is worth less than the run."""
        if not self._pending or self._failed:
            return
        try:
            with tf.io.gfile.GFile(self.path, "a") as f:
                f.write("".join(self._pending))
        except (tf.errors.OpError, OSError) as e:
            self._failed = True
            logging.warning("goodput.jsonl cannot be appended to (%s); no goodput for this "
                            "launch.", str(e).strip().splitlines()[0][:200])
        self._pending, self._flushed = [], self._last_time


def _parse(line):
    """The event of a ledger line: none if a kill cut it short, and the event after the
    cut if a launch appended it to the same line (as versions before the fresh-line
    check did)."""
    at = 0
    while at >= 0:
        try:
            return [json.loads(line[at:])]
        except ValueError:
            at = line.find('{"event"', at + 1)
    return []


def account(events):
    """{"goodput": fraction, "wall_seconds", "productive_seconds", "badput_seconds":
    {bucket: seconds}, "launches", "steps_redone"} of a ledger's events. Each launch is
    timed on its own clock: the hosts of launches may disagree."""
    buckets = dict.fromkeys(BUCKETS, 0.0)
    productive, launches, redone_steps, wall = 0.0, 0, 0, 0.0
    reached = 0  # the furthest step any earlier launch ran to
    previous_end = None
    for launch in _launches(events):
        start = launch[0]
        launches += 1
        if previous_end is not None:
            buckets["idle"] += max(start["process_start"] - previous_end, 0.0)
        wall += launch[-1]["time"] - start["process_start"]
        buckets["checkpoint_restore"] += start["restore_seconds"]
        buckets["startup"] += start["time"] - start["process_start"] - start["restore_seconds"]
        cycles = [e for e in launch if e["event"] == "cycle"]
        # (a ledger written before `traced` was recorded: the first chunk traced)
        traced = [i == 0 or c.get("traced", False) for i, c in enumerate(cycles)]
        pace = _pace([c for c, t in zip(cycles, traced) if not t])  # once compiled
        last = start["time"]
        for i, c in enumerate(cycles):
            s = c["seconds"]
            stepping = s.get("train", 0.0) - s.get("input_wait", 0.0)
            if traced[i] and pace is not None:
                compile_seconds = max(stepping - pace * c["steps"], 0.0)
                buckets["compile"] += compile_seconds
                stepping -= compile_seconds
            again = max(min(c["step"], reached) - (c["step"] - c["steps"]), 0)
            redone = stepping * again / max(c["steps"], 1)
            redone_steps += again
            buckets["redone"] += redone
            productive += stepping - redone
            buckets["data_wait"] += s.get("input_wait", 0.0)
            buckets["checkpoint_save"] += s.get("checkpoint", 0.0)
            buckets["evaluation"] += s.get("eval", 0.0)
            known = sum(s.get(k, 0.0) for k in ("train", "checkpoint", "eval"))
            buckets["other"] += (c["time"] - last) - known  # host work, other actions
            last = c["time"]
        buckets["other"] += launch[-1]["time"] - last  # after the last cycle: exit work
        reached = max([reached] + [c["step"] for c in cycles])
        previous_end = launch[-1]["time"]
    if not launches:
        return None
    wall += buckets["idle"]
    return {"goodput": round(productive / wall, 4) if wall > 0 else None,
            "wall_seconds": round(wall, 3), "productive_seconds": round(productive, 3),
            "badput_seconds": {k: round(v, 3) for k, v in buckets.items()},
            "launches": launches, "steps_redone": redone_steps}


def _launches(events):
    """The events grouped by launch (each from its `start`); events before the first
    `start` (a ledger cut at its head) are dropped."""
    launches = []
    for event in events:
        if event["event"] == "start":
            launches.append([event])
        elif launches:
            launches[-1].append(event)
    return launches


def _pace(cycles):
    """The median seconds per step of compiled chunks (input wait excluded), or None."""
    paces = [(c["seconds"].get("train", 0.0) - c["seconds"].get("input_wait", 0.0))
             / c["steps"] for c in cycles if c["steps"]]
    return statistics.median(paces) if paces else None


def breakdown(spent, wall):
    """Fractions of `wall` seconds of the loop: waiting on input, in the compiled step,
    saving checkpoints, evaluating, and host work (the rest: logging, summaries,
    other actions); `spent`: seconds by kind over that time (the Controller's)."""
    wall = max(wall, 1e-9)
    parts = {"input_wait": spent.get("input_wait", 0.0),
             "step": spent.get("train", 0.0) - spent.get("input_wait", 0.0),
             "checkpoint": spent.get("checkpoint", 0.0), "eval": spent.get("eval", 0.0)}
    parts["host"] = max(wall - sum(parts.values()), 0.0)
    return {k: round(v / wall, 4) for k, v in parts.items()}


_BOUND = {"input_wait": "input-bound: {:.0%} waiting on data",
          "host": "host-bound: {:.0%} in host work between loops",
          "checkpoint": "checkpoint-bound: {:.0%} saving checkpoints",
          "eval": "eval-bound: {:.0%} evaluating"}


def bottleneck(fractions, input_remedy=""):
    """"input-bound: 41% waiting on data (remedy: ...)" when the largest share is not the
    compiled step, else ""; `input_remedy` is the task's (Task.input_remedy)."""
    largest = max(fractions, key=fractions.get)
    if largest == "step":
        return ""
    remedy = f" (remedy: {input_remedy})" if largest == "input_wait" and input_remedy else ""
    return _BOUND[largest].format(fractions[largest]) + remedy


def log_table(report):
    """The goodput table, logged at the end of a run."""
    if not report:
        return
    wall = max(report["wall_seconds"], 1e-9)
    rows = [("productive", report["productive_seconds"])] + list(
        report["badput_seconds"].items())
    logging.info("Goodput %.1f%% of %.0f s over %d launch(es)%s:\n%s",
                 100 * (report["goodput"] or 0.0), wall, report["launches"],
                 f", {report['steps_redone']} steps redone" if report["steps_redone"] else "",
                 "\n".join(f"  {name:<19}{seconds:>10.1f} s {100 * seconds / wall:6.1f}%"
                           for name, seconds in rows))
