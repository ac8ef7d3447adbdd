"""Fault injection: kill a training job N times, relaunch it, prove nothing was lost.

python -m benchmarks.faults --kills=3 -- --config=configs/cifar.py --config.trainer.train_steps=200
python -m benchmarks.faults --kills=2 --workers=2 -- --config=configs/cifar.py ...

After `--` come the arguments of `launch.py` (the config and its overrides);
`--mode=train` and `--config.trainer.deterministic=True` are added, and with
`--workers=2` the job is two MultiWorkerMirrored processes on localhost.

First an uninterrupted reference run, then the faulted run: each launch is
interrupted at a random (seeded) step of the first half of the steps left, and
a random fraction of 5 steps' time after it, by SIGKILL or SIGTERM in turn
(seeded order) to a random worker; the harness waits for every process to exit, as a cluster
scheduler would, and relaunches all of them on the same workdir. After N
kills the last launch runs to the end. Checked at the end:

- the faulted run ends at exactly `train_steps`;
- every saved value equals the reference run's bitwise (deterministic ops);
- no worker took longer than --hang_bound to exit: the victim after its signal, the
  others after the victim died;
- every checkpoint left in the workdir (the rotation and best/) reads.

Prints a table (kills, recoveries, steps redone, seconds lost) and writes it
with the checks to OUT/faults.json; the exit status is 1 if a check failed.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from trainer.loop.goodput import Ledger, account
from trainer.runtime.local_workers import free_ports, worker_env
from trainer.state.checkpoints import read_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_LINE = re.compile(r"step (\d+)/(\d+):")


class Job:
    """One launch: `workers` processes of launch.py on `workdir`, each logging to a file."""

    def __init__(self, launch_args, workdir, workers, log_prefix):
        args = [sys.executable, os.path.join(ROOT, "launch.py"), *launch_args,
                f"--workdir={workdir}", "--mode=train", "--config.trainer.deterministic=True"]
        cluster = {"worker": [f"localhost:{p}" for p in free_ports(workers)]}
        self.logs, self.procs = [], []
        for i in range(workers):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
            extra = []
            if workers > 1:
                env = worker_env(cluster, i, env)
                extra = ["--config.distribution.strategy=multi_worker"]
            self.logs.append(f"{log_prefix}-worker{i}.log")
            self.procs.append(subprocess.Popen(args + extra, cwd=ROOT, env=env,
                                               stdout=open(self.logs[-1], "w"),
                                               stderr=subprocess.STDOUT))
        self.started = time.monotonic()

    def running(self):
        return [p.poll() is None for p in self.procs]

    def first_step(self, timeout):
        """Seconds from launch to the chief's first logged step, or None if the job
        exited first (or `timeout` passed)."""
        while time.monotonic() - self.started < timeout and all(self.running()):
            with open(self.logs[0]) as f:
                if STEP_LINE.search(f.read()):
                    return time.monotonic() - self.started
            time.sleep(0.1)
        return None

    def wait(self, timeout):
        """Exit codes, killing whatever is still running after `timeout` (None for it)."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(deadline - time.monotonic(), 0.01)))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes

    def log(self, i=0):
        with open(self.logs[i]) as f:
            return f.read()


def _ledger(workdir):
    """The goodput ledger's events so far (a line a kill cut short is skipped)."""
    return Ledger(workdir, is_chief=False).read()


def _reached(events):
    return max([e["step"] for e in events if e["event"] in ("cycle", "start")] + [0])


def reference_run(launch_args, out, workers, timeout):
    """The uninterrupted run: its workdir and wall seconds."""
    workdir = os.path.join(out, "reference")
    job = Job(launch_args, workdir, workers, os.path.join(out, "logs", "reference"))
    first = job.first_step(timeout)
    codes = job.wait(timeout)
    if codes != [0] * workers or first is None:
        raise RuntimeError(f"The reference run failed (exit codes {codes}):\n"
                           + job.log()[-3000:])
    return workdir, time.monotonic() - job.started


def faulted_run(launch_args, out, workers, kills, seed, pace, hang_bound, timeout):
    """Launches, kills and relaunches; returns the workdir, wall seconds and one row
    per kill."""
    rng = random.Random(seed)
    workdir = os.path.join(out, "faulted")
    first_signal = rng.choice([signal.SIGKILL, signal.SIGTERM])
    other = signal.SIGTERM if first_signal == signal.SIGKILL else signal.SIGKILL
    rows, started = [], time.monotonic()
    for k in range(kills + 1):
        job = Job(launch_args, workdir, workers, os.path.join(out, "logs", f"launch{k}"))
        if k == kills:  # the last launch runs to the end
            codes = job.wait(timeout)
            if codes != [0] * workers:
                raise RuntimeError(f"The final launch failed (exit codes {codes}):\n"
                                   + job.log()[-3000:])
            break
        if job.first_step(timeout) is None:
            raise RuntimeError(f"Launch {k} logged no step:\n{job.log()[-3000:]}")
        target = int(STEP_LINE.search(job.log()).group(2))
        # A step in the first half of what is left, then up to 5 steps more.
        reached = _reached(_ledger(workdir))
        kill_step = reached + rng.randint(1, max((target - reached) // 2, 1))
        extra = rng.uniform(0.0, 5 * pace)
        while _reached(_ledger(workdir)) < kill_step and all(job.running()):
            time.sleep(0.02)
        time.sleep(extra)
        victim = rng.randrange(workers)
        signum = first_signal if k % 2 == 0 else other
        before = _reached(_ledger(workdir))
        if not all(job.running()) or before >= target:
            raise RuntimeError(f"Launch {k} ended before its kill; give it more "
                               "train_steps:\n" + job.log()[-2000:])
        job.procs[victim].send_signal(signum)
        killed = time.monotonic()
        try:  # a SIGTERM lets it finish its chunk and save; bounded like its peers
            job.procs[victim].wait(timeout=hang_bound)
        except subprocess.TimeoutExpired:
            job.procs[victim].kill()
            job.procs[victim].wait()
        died = time.monotonic()
        codes = job.wait(hang_bound)  # the others: a peer that hangs is killed at the bound
        exits = {i: round(time.monotonic() - died, 1) for i in range(workers) if i != victim}
        rows.append({"kill": k + 1, "victim": f"worker {victim}",
                     "signal": signal.Signals(signum).name,
                     "at_step": before, "exit_codes": codes,
                     "victim_exit_seconds": round(died - killed, 1),
                     "peers_exit_seconds": exits,
                     "hung": died - killed >= hang_bound or any(c is None for c in codes)})
    return workdir, time.monotonic() - started, rows


def saved_values(workdir, step):
    """{name: value} of checkpoint `step`, without the save counter."""
    reader = tf.train.load_checkpoint(os.path.join(workdir, "checkpoints", f"ckpt-{step}"))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if "save_counter" not in n and n != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def unreadable_checkpoints(workdir):
    """Every checkpoint left in `workdir` (the rotation, best/) that does not read."""
    bad = []
    for index in tf.io.gfile.glob(os.path.join(workdir, "*", "ckpt-*.index")):
        error = read_error(index[:-len(".index")])
        if error:
            bad.append(f"{index}: {error}")
    return bad


def run(launch_args, out, kills=3, workers=1, seed=0, hang_bound=90.0, timeout=900.0):
    """The whole experiment; returns the report (see the module docstring)."""
    for name in ("reference", "faulted"):
        if os.path.exists(os.path.join(out, name)):
            raise FileExistsError(f"{out}/{name} exists (an earlier experiment); choose a "
                                  "new --out.")
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    reference, reference_seconds = reference_run(launch_args, out, workers, timeout)
    target = json.load(open(os.path.join(reference, "summary.json")))["train_steps"]
    cycles = [e for e in _ledger(reference) if e["event"] == "cycle"][1:]  # compiled
    pace = 0.0  # wall seconds per step once compiled, actions included
    if len(cycles) > 1:
        pace = ((cycles[-1]["time"] - cycles[0]["time"])
                / max(cycles[-1]["step"] - cycles[0]["step"], 1))
    # The same XLA choice as the reference, not a timing of its own (XLA changes numerics).
    xla = json.load(open(os.path.join(reference, "summary.json"))).get("jit_compile")
    if xla is not None:
        launch_args = launch_args + [f"--config.trainer.jit_compile={'on' if xla else 'off'}"]
    workdir, seconds, rows = faulted_run(launch_args, out, workers, kills, seed, pace,
                                         hang_bound, timeout)
    events = _ledger(workdir)
    starts = [e for e in events if e["event"] == "start"]
    for row, start in zip(rows, starts[1:]):  # what each relaunch restored and redid
        row["restored_step"] = start["step"]
        row["steps_redone"] = max(row["at_step"] - start["step"], 0)
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    want, got = saved_values(reference, target), saved_values(workdir, summary["steps"])
    differ = sorted(n for n in want if n not in got or not np.array_equal(want[n], got[n]))
    checks = {
        "final_step": summary["steps"] == target,
        "bitwise_equal": not differ and set(want) == set(got),
        "no_hang": not any(r["hung"] for r in rows),
        "checkpoints_read": not unreadable_checkpoints(workdir),
    }
    return {
        "workers": workers, "kills": len(rows), "target_step": target,
        "final_step": summary["steps"],
        "recoveries": sum(1 for s in starts[1:] if s["step"] > 0),
        "steps_redone": sum(r.get("steps_redone", 0) for r in rows),
        "seconds_lost": round(seconds - reference_seconds, 1),
        "reference_seconds": round(reference_seconds, 1), "faulted_seconds": round(seconds, 1),
        "hang_bound_seconds": hang_bound, "rows": rows, "checks": checks,
        "values_compared": len(want), "values_differing": differ[:20], "unreadable": unreadable_checkpoints(workdir),
        "goodput": account(events), "passed": all(checks.values()),
    }


def print_report(report):
    print(f"\n{report['kills']} kills on {report['workers']} worker(s), "
          f"target step {report['target_step']}:")
    print(f"{'kill':>4}  {'victim':<9}{'signal':<8}{'at step':>8}{'restored':>9}"
          f"{'redone':>7}  {'exit codes':<16}{'peers exit (s)':<16}")
    for r in report["rows"]:
        print(f"{r['kill']:>4}  {r['victim']:<9}{r['signal']:<8}{r['at_step']:>8}"
              f"{r.get('restored_step', '-'):>9}{r.get('steps_redone', '-'):>7}  "
              f"{str(r['exit_codes']):<16}{str(r['peers_exit_seconds'] or '-'):<16}")
    print(f"recoveries {report['recoveries']}, steps redone {report['steps_redone']}, "
          f"seconds lost {report['seconds_lost']} ({report['faulted_seconds']} s against "
          f"{report['reference_seconds']} s uninterrupted)")
    if report["goodput"]:
        print(f"goodput {report['goodput']['goodput']:.1%}; badput seconds: "
              + ", ".join(f"{k} {v}" for k, v in report["goodput"]["badput_seconds"].items()))
    for name, ok in report["checks"].items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                      usage="python -m benchmarks.faults [options] -- "
                                            "--config=FILE [--config.a.b=value ...]")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, choices=(1, 2))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang_bound", type=float, default=90.0,
                        help="seconds a worker may take to exit after a peer died")
    parser.add_argument("--out", default="bench_faults")
    options, launch_args = parser.parse_known_args()
    launch_args = [a for a in launch_args if a != "--"]
    if not any(a.startswith("--config=") for a in launch_args):
        parser.error("give the job's --config=FILE (and its overrides) after --")
    report = run(launch_args, options.out, options.kills, options.workers, options.seed,
                 options.hang_bound)
    with open(os.path.join(options.out, "faults.json"), "w") as f:
        json.dump(report, f, indent=2)
    print_report(report)
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
