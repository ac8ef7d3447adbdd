"""launch.py runs of the benchmarks, in child processes: each run's stderr, summary and
peak memory, and its pace."""

import json
import os
import re
import resource
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(args, workdir):
    """launch.py in a child; (stderr, summary.json, the child's peak resident MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    run = subprocess.run([sys.executable, "launch.py", *args, f"--workdir={workdir}"],
                         cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if run.returncode:
        raise RuntimeError(run.stderr[-3000:])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    return run.stderr, summary, (peak if peak > before else float("nan")) / 1024


def flags_of(config_overrides):
    return [f"--config.{k}={v}" for k, v in config_overrides.items()]


def steps_per_second(stderr):
    rates = [float(m.group(1)) for m in re.finditer(r"([\d.]+) steps/s", stderr)]
    return statistics.median(rates[1:]) if len(rates) > 1 else rates[0]


def run_parts(parts, functions, out):
    """Runs each named part (`functions[part](out)`, its rows) in turn, keeping every
    part's rows in out/results.json (those of earlier invocations too) and a table of
    them in out/results.md."""
    unknown = [p for p in parts if p not in functions]
    if unknown:
        raise SystemExit(f"Unknown parts {unknown}; choose from {', '.join(functions)}.")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.json")
    results = json.load(open(path)) if os.path.exists(path) else {}
    for part in parts:
        results[part] = functions[part](out)
        print(part, json.dumps(results[part], indent=1), flush=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    with open(os.path.join(out, "results.md"), "w") as f:
        for part, rows in results.items():
            f.write(f"### {part}\n\n| measure | value |\n|---|---|\n")
            f.writelines(f"| {k} | {v:.4g} |\n" if isinstance(v, float) else f"| {k} | {v} |\n"
                         for k, v in rows.items())
            f.write("\n")
