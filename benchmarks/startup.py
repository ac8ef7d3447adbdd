"""What a launch costs before its first steps and after its last, phase by phase: the
Trainer's first launch and relaunch against `model.fit` on the same config.

python -m benchmarks.startup                            # the shipped CPU configs
python -m benchmarks.startup --configs=cifar --repeats=1

Each run is a fresh process of `--steps` steps in chunks of 10 (the Trainer's
`steps_per_loop`, fit's `steps_per_execution`), timed by this process from the
spawn to the exit. The Trainer's phases come from its ledger (goodput.jsonl:
imports, strategy, build, restore, jit choice, data, other; the first chunk's
compile); fit's from a script with the same marks (imports, strategy, data, model
and compile, the first chunk). "last step to exit" is from the end of the last
chunk to the process's exit (the Trainer's final save and summary included).
Precision `auto`, `jit_compile=auto` as shipped; each repeat starts from a user cache
holding only the CPU peak (a new model on this machine). Writes results.json and results.md
to --out.
"""

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from benchmarks.contenders import fit_setup, fresh_cache
from benchmarks.scratch import fresh_directory

FLAGS = flags.FLAGS
flags.DEFINE_list("configs", ["cifar", "lm", "vit_cifar"], "Config files in configs/.")
flags.DEFINE_integer("steps", 40, "Steps per run (the relaunch runs as many more).")
flags.DEFINE_integer("repeats", 3, "Runs per row; the table gives min-max.")
flags.DEFINE_string("out", "bench_startup", "Output directory.")
# Internal: a fit run, in a process of its own.
flags.DEFINE_string("fit_out", None, "Internal: run the fit contender, marks to this file.")
config_flags.DEFINE_config_file("config", None, "Internal: the fit contender's config.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHUNK = 10
SMALL = {"cifar": ["--config.data.source=synthetic", "--config.data.synthetic_train_size=8192",
                   "--config.data.synthetic_test_size=512"],
         "vit_cifar": ["--config.data.source=synthetic",
                       "--config.data.synthetic_train_size=8192",
                       "--config.data.synthetic_test_size=512"],
         "lm": []}


def common_args(name, steps):
    return [f"--config=configs/{name}.py", *SMALL.get(name, []),
            f"--config.trainer.train_steps={steps}", f"--config.trainer.steps_per_loop={CHUNK}",
            f"--config.trainer.log_every={CHUNK}", "--config.trainer.eval_every=0",
            "--config.trainer.checkpoint_every=0", "--config.optimizer.warmup_steps=0"]


def spawn(args, log, cache):
    start = time.time()
    with open(log, "w") as out:
        rc = subprocess.call([sys.executable, *args], cwd=REPO, stdout=out,
                             stderr=subprocess.STDOUT,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                      XDG_CACHE_HOME=cache))
    end = time.time()
    if rc:
        with open(log) as f:
            raise RuntimeError(f"{' '.join(args)} failed ({rc}):\n" + f.read()[-3000:])
    return start, end


def trainer_launch(name, workdir, steps, log, cache):
    """{phase: seconds} of one Trainer launch (the ledger's last launch)."""
    spawned, exited = spawn(["launch.py", f"--workdir={workdir}", "--mode=train",
                             *common_args(name, steps)], log, cache)
    with open(os.path.join(workdir, "goodput.jsonl")) as f:
        events = [json.loads(line) for line in f if line.strip()]
    start = max(i for i, e in enumerate(events) if e["event"] == "start")
    launch = events[start:]
    cycles = [e for e in launch if e["event"] == "cycle"]
    first, last = cycles[0], cycles[-1]
    pace = statistics.median(c["seconds"]["train"] / c["steps"] for c in cycles[1:]) \
        if len(cycles) > 1 else 0.0
    row = dict(launch[0].get("phases", {}))  # (ledgers before the phases: totals only)
    row["restore"] = launch[0]["restore_seconds"]
    row["first chunk beyond its steps"] = max(first["seconds"]["train"] - pace * first["steps"], 0)
    row["to the first chunk's end"] = first["time"] - launch[0]["process_start"]
    row["last step to exit"] = exited - last["time"]
    row["process start lag"] = launch[0]["process_start"] - spawned  # the spawn itself
    row["wall"] = exited - spawned
    return row


def fit_launch(name, workdir, steps, log, cache):
    marks_path = os.path.join(workdir, "marks.json")
    os.makedirs(workdir, exist_ok=True)
    spawned, exited = spawn(["-m", "benchmarks.startup", f"--fit_out={marks_path}",
                             *common_args(name, steps)], log, cache)
    with open(marks_path) as f:
        marks = json.load(f)
    row, last = {}, marks.pop("process_start")
    for phase in ("imports", "strategy", "data", "build"):
        row[phase] = marks[phase] - last
        last = marks[phase]
    row["first chunk beyond its steps"] = max(
        marks["first_chunk"] - last - marks["pace"] * CHUNK, 0.0)
    row["to the first chunk's end"] = marks["first_chunk"] - marks["process_start_time"]
    row["last step to exit"] = exited - marks["last_chunk"]
    row["process start lag"] = marks["process_start_time"] - spawned
    row["wall"] = exited - spawned
    return row


def fit_run(config, out):
    """Keras `fit` on the config's task, model and optimizer, marking its phases."""
    import keras
    from trainer.loop.goodput import process_start_time
    marks = {"process_start": process_start_time(), "imports": time.time()}
    marks["process_start_time"] = marks["process_start"]
    _, model, train, _ = fit_setup(config, CHUNK, lambda phase: marks.update({
        phase: time.time()}))
    ends = []
    callback = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append(time.time()))
    model.fit(train, steps_per_epoch=config.trainer.train_steps, epochs=1, verbose=0,
              callbacks=[callback])
    marks["first_chunk"], marks["last_chunk"] = ends[0], ends[-1]
    marks["pace"] = statistics.median(b - a for a, b in zip(ends[:-1], ends[1:])) / CHUNK
    with open(out, "w") as f:
        json.dump(marks, f)


PHASES = ["imports", "strategy", "build", "data", "restore", "jit_choice", "other",
          "first chunk beyond its steps", "to the first chunk's end", "last step to exit",
          "wall"]


def span(values):
    return f"{min(values):.1f}" if max(values) - min(values) < 0.05 else \
        f"{min(values):.1f}-{max(values):.1f}"


def markdown(results):
    text = []
    for name, runs in results.items():
        text += [f"**{name}** (seconds, min-max of {FLAGS.repeats})", "",
                 "| phase | Trainer, first launch | Trainer, relaunch | fit |",
                 "|---|---|---|---|"]
        for phase in PHASES:
            cells = [span([r[phase] for r in runs[k]]) if all(phase in r for r in runs[k])
                     else "-" for k in ("first", "relaunch", "fit")]
            text.append(f"| {phase.replace('_', ' ')} | " + " | ".join(cells) + " |")
        text.append("")
    return "\n".join(text)


def benchmark():
    os.makedirs(FLAGS.out, exist_ok=True)
    results = {}
    for name in FLAGS.configs:
        runs = {"first": [], "relaunch": [], "fit": []}
        for repeat in range(FLAGS.repeats):
            base = fresh_directory(os.path.join(FLAGS.out, "runs", f"{name}_{repeat}"))
            cache = fresh_cache(base)
            runs["first"].append(trainer_launch(name, f"{base}/trainer", FLAGS.steps,
                                                f"{base}/first.log", cache))
            runs["relaunch"].append(trainer_launch(name, f"{base}/trainer", 2 * FLAGS.steps,
                                                   f"{base}/relaunch.log", cache))
            runs["fit"].append(fit_launch(name, f"{base}/fit", FLAGS.steps, f"{base}/fit.log",
                                          cache))
        results[name] = runs
    text = markdown(results)
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(FLAGS.out, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)


def main(argv):
    del argv
    if FLAGS.fit_out:
        fit_run(FLAGS.config, FLAGS.fit_out)
    else:
        benchmark()


if __name__ == "__main__":
    app.run(main)
