"""Examples/s reading images from files against in-memory arrays of the same images.

python -m benchmarks.input                         # seed CNN and ResNet, every format
python -m benchmarks.input --models=seed_cnn --steps=60 --out=bench_input

20,000 PNG images (32x32 RGB, 10 classes, made from scikit-learn's digits: enlarged,
tinted, shifted and noised so no two are alike; `pip install -e .[bench]`) are written
once as a class folder, as 16 TFRecord shards and in CIFAR-10's format. Each row is a
fresh `launch.py` process training `--steps` steps at `--batch` (precision auto, no
XLA timing); examples/s is the median of the log intervals after the first (compiling),
and input wait is the run's share of time spent waiting on data (summary.json). The
`resume` table times a relaunch from a mid-epoch checkpoint to its first logged step.
Writes results.json and results.md to --out.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time

from absl import app, flags

from benchmarks.image_files import write_data
from benchmarks.scratch import fresh_directory

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["seed_cnn", "resnet"], "seed_cnn and/or resnet.")
flags.DEFINE_list("formats", ["memory", "folder", "tfrecord", "folder_cache"],
                  "memory (CIFAR format, in-memory arrays), folder, tfrecord, folder_cache.")
flags.DEFINE_integer("images", 20_000, "Images in the train set.")
flags.DEFINE_integer("batch", 512, "Global batch size.")
flags.DEFINE_integer("steps", 120, "Train steps per run (log every steps/6).")
flags.DEFINE_string("data", "", "Where the images are written ('' : --out/data).")
flags.DEFINE_string("out", "bench_input", "Output directory.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_args(model, fmt, root, workdir, steps):
    every = max(steps // 6, 1)
    common = [f"--workdir={workdir}", "--mode=train", f"--config.model.name={model}",
              f"--config.data.global_batch_size={FLAGS.batch}",
              "--config.data.normalization=unit_range",
              f"--config.data.augment={model == 'resnet'}",
              f"--config.trainer.train_steps={steps}",
              f"--config.trainer.steps_per_loop={every}", f"--config.trainer.log_every={every}",
              "--config.trainer.checkpoint_every=0", "--config.trainer.jit_compile=off",
              "--config.optimizer.warmup_steps=0"]
    if fmt == "memory":
        return ["--config=configs/cifar.py", "--config.data.source=cifar10",
                f"--config.data.data_dir={root}/cifar"] + common
    files = {"folder": (f"{root}/folder/train", f"{root}/folder/eval"),
             "tfrecord": (f"{root}/tfrecord/train-*", f"{root}/tfrecord/eval-*")}
    kind = fmt.split("_")[0]
    return ["--config=configs/images.py", f"--config.data.format={kind}",
            f"--config.data.train={files[kind][0]}", f"--config.data.eval={files[kind][1]}",
            "--config.data.image_size=32", "--config.data.num_classes=10",
            f"--config.data.cache={fmt.endswith('_cache')}"] + common


def launch(args):
    """Runs launch.py; returns (stderr lines with their seconds since the launch, rc)."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "launch.py", *args], cwd=REPO,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [(time.monotonic() - start, line) for line in proc.stderr]
    return lines, proc.wait()


def throughput(model, fmt, root):
    workdir = fresh_directory(os.path.join(FLAGS.out, "runs", f"{model}_{fmt}"))
    lines, rc = launch(run_args(model, fmt, root, workdir, FLAGS.steps))
    if rc:
        raise RuntimeError("".join(line for _, line in lines)[-3000:])
    rates = [float(m.group(1)) for _, line in lines
             for m in [re.search(r"step \d+/\d+: .*\| (\d+) ex/s", line)] if m]
    with open(os.path.join(workdir, "summary.json")) as f:
        shares = json.load(f)["time_breakdown"]
    return {"model": model, "format": fmt, "examples_per_sec": statistics.median(rates[1:]),
            "input_wait": shares["input_wait"]}


def resume_cost(fmt, root):
    """Seconds from a relaunch at a mid-epoch checkpoint to its first step, and from a
    fresh launch to its first step."""
    workdir = fresh_directory(os.path.join(FLAGS.out, "runs", f"resume_{fmt}"))
    mid = FLAGS.images // FLAGS.batch // 2
    out = {"format": fmt}
    for name, steps in (("fresh_to_first_step", mid), ("relaunch_to_first_step", mid + 1)):
        args = run_args("seed_cnn", fmt, root, workdir, steps)
        args = [a for a in args if "log_every" not in a and "steps_per_loop" not in a]
        lines, rc = launch(args + ["--config.trainer.log_every=1",
                                   "--config.trainer.steps_per_loop=1"])
        if rc:
            raise RuntimeError("".join(line for _, line in lines)[-3000:])
        out[name] = next(t for t, line in lines if re.search(r"step \d+/\d+: ", line))
    return out


def markdown(rows):
    memory = {r["model"]: r["examples_per_sec"] for r in rows if r["format"] == "memory"}
    text = ["| model | format | examples/s | vs memory | input wait |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = r["examples_per_sec"] / memory[r["model"]] if r["model"] in memory else 0
        text.append(f"| {r['model']} | {r['format']} | {r['examples_per_sec']:.0f} | "
                    f"{ratio:.2f}x | {r['input_wait']:.1%} |")
    return "\n".join(text)


def main(argv):
    del argv
    os.makedirs(FLAGS.out, exist_ok=True)
    root = write_data(FLAGS.data or os.path.join(FLAGS.out, "data"), FLAGS.images)
    rows = [throughput(m, f, root) for m in FLAGS.models for f in FLAGS.formats]
    resume = [resume_cost(f, root) for f in FLAGS.formats]
    text = markdown(rows) + "\n\n| format | fresh launch to first step s | relaunch " \
        "at mid-epoch to first step s |\n|---|---|---|\n" + "\n".join(
            f"| {r['format']} | {r['fresh_to_first_step']:.1f} | "
            f"{r['relaunch_to_first_step']:.1f} |" for r in resume)
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
        json.dump({"throughput": rows, "resume": resume}, f, indent=1)
    with open(os.path.join(FLAGS.out, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    app.run(main)
