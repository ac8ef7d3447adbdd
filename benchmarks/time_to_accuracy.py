"""Wall time to a target validation quality: the Trainer against Keras `model.fit`.

python -m benchmarks.time_to_accuracy                      # both workloads, 3 repeats
python -m benchmarks.time_to_accuracy --workloads=digits --repeats=1

Each run is a fresh process timed from its launch, so startup, data loading,
compilation (and the Trainer's `jit_compile=auto` choice) count; each starts from a
user cache holding only the CPU's peak, as a first launch of the model on this
machine. Both contenders
get the same config: model, data pipeline, global batch, optimizer and schedule,
precision (`auto`), evaluation every `eval_every` steps over the same split. The
Trainer runs `launch.py --mode=train_and_eval` with `steps_per_loop=eval_every`;
fit runs `model.fit(steps_per_epoch=eval_every, steps_per_execution=eval_every)`,
one compiled call per evaluation, its fastest setting (benchmarks/compare.py).
A run stops once an evaluation reaches the target; its time is that
evaluation's wall clock minus the launch.

Workloads (real data available offline; synthetic data is too easy to mean anything):
- `lm`: the byte LM (configs/lm.py) on this Python's standard library, to a
  validation bits-per-byte target.
- `cnn`: the default CIFAR job (configs/cifar.py as shipped: the seed CNN, batch
  512, Adam) on scikit-learn's 1,797 8x8 handwritten digits (`pip install -e .[test]`),
  scaled to 32x32x3 and written in CIFAR-10's file format, to a test accuracy target.
- `digits`: the same data with the CIFAR task's ResNet (batch 128).

Repeats alternate the contenders (T F T F ...). Writes results.json and results.md to --out.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from benchmarks.contenders import fit_setup, fresh_cache

FLAGS = flags.FLAGS
flags.DEFINE_list("workloads", ["cnn", "lm", "digits"], "cnn, lm and/or digits.")
flags.DEFINE_integer("repeats", 3, "Runs per contender and workload.")
flags.DEFINE_string("out", "bench_tta", "Output directory.")
flags.DEFINE_float("max_seconds", 900, "A run that has not reached its target by then fails.")
flags.DEFINE_float("target", None, "Another target for the one workload run.")
flags.DEFINE_integer("eval_every", 0, "Another evaluation interval (0: the workload's).")
flags.DEFINE_list("set", [], "More config overrides for every run, e.g. "
                  "model.num_layers=1,data.max_bytes=100000 (a smaller model for a smoke test).")
# Internal: a fit run, launched by this module in a process of its own.
flags.DEFINE_string("fit_workdir", None, "Internal: run the fit contender in this workdir.")
config_flags.DEFINE_config_file("config", None, "Internal: the fit contender's config.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIT_LOG = "fit_evals.jsonl"

WORKLOADS = {
    "lm": dict(config="configs/lm.py", metric="bits_per_byte", target=2.4, mode="min",
               eval_every=100, overrides={
                   "trainer.train_steps": 1500,  # the schedule's length, not a stop
                   "sample.summary_tokens": 0}),  # fit has no samples
    "cnn": dict(config="configs/cifar.py", metric="accuracy", target=0.90, mode="max",
                eval_every=10, overrides={"data.source": "cifar10", "trainer.train_steps": 300}),
    "digits": dict(config="configs/cifar.py", metric="accuracy", target=0.94, mode="max",
                   eval_every=25, overrides={
                       "model.name": "resnet", "data.source": "cifar10",
                       "data.global_batch_size": 128, "trainer.train_steps": 600}),
}


def write_digits(folder):
    """scikit-learn's digits (UCI): 1,497 train and the last 300 as test, 8x8 pixels
    of 0-16 scaled to 0-255 and enlarged 4x to 32x32, grey on three channels."""
    import numpy as np
    from sklearn.datasets import load_digits
    from trainer.data.images import cifar10 as cifar10_data
    digits = load_digits()
    images = (digits.images * (255 / 16)).round().astype(np.uint8)
    images = images.repeat(4, axis=1).repeat(4, axis=2)[..., None].repeat(3, axis=3)
    labels = digits.target.astype(np.int32)
    data = cifar10_data.Cifar10(images[:-300], labels[:-300], images[-300:], labels[-300:],
                                source="scikit-learn digits (UCI), 32x32")
    cifar10_data.write_folder(data, os.path.join(folder, cifar10_data.FOLDER))
    return folder


def run_args(workload, data_dir):
    """The shared config flags of one workload."""
    w = WORKLOADS[workload]
    every = FLAGS.eval_every or w["eval_every"]
    overrides = dict(w["overrides"], **{
        "trainer.eval_every": every, "trainer.steps_per_loop": every,
        "trainer.checkpoint_every": 0, "trainer.log_every": every})
    if data_dir:
        overrides["data.data_dir"] = data_dir
    overrides.update(item.split("=", 1) for item in FLAGS.set)
    return [f"--config={os.path.join(REPO, w['config'])}"] + [
        f"--config.{key}={value}" for key, value in overrides.items()]


def read_evals(contender, workdir, metric):
    """[(wall time, step, value)] of the evaluations written so far."""
    if contender == "fit":
        path = os.path.join(workdir, FIT_LOG)
        if not os.path.exists(path):
            return []
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.endswith("\n")]
        return [(r["time"], r["step"], r[metric]) for r in rows]
    import tensorflow as tf
    evals = []
    for path in sorted(tf.io.gfile.glob(os.path.join(workdir, "eval", "events.out.*"))):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    if value.tag == metric:
                        evals.append((event.wall_time, event.step,
                                      float(tf.make_ndarray(value.tensor))))
        except tf.errors.DataLossError:  # the record being written
            pass
    return evals


def reached(value, w):
    return value <= w["target"] if w["mode"] == "min" else value >= w["target"]


def run_once(contender, workload, data_dir, workdir):
    """Launches one run, stops it at the first evaluation that reaches the target."""
    w = WORKLOADS[workload]
    if contender == "trainer":
        cmd = [sys.executable, os.path.join(REPO, "launch.py"), f"--workdir={workdir}",
               "--mode=train_and_eval"]
    else:
        cmd = [sys.executable, "-m", "benchmarks.time_to_accuracy", f"--fit_workdir={workdir}"]
    cmd += run_args(workload, data_dir)
    os.makedirs(os.path.dirname(workdir), exist_ok=True)
    log = open(workdir + ".log", "w")
    env = dict(os.environ, XDG_CACHE_HOME=fresh_cache(workdir + ".user"))
    start = time.time()
    process = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    hit, evals = None, []
    while hit is None and time.time() - start < FLAGS.max_seconds:
        time.sleep(0.5)
        evals = read_evals(contender, workdir, w["metric"])
        hit = next((e for e in evals if reached(e[2], w)), None)
        if hit is None and process.poll() is not None:
            evals = read_evals(contender, workdir, w["metric"])
            hit = next((e for e in evals if reached(e[2], w)), None)
            break
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    log.close()
    if hit is None:
        best = (min if w["mode"] == "min" else max)((e[2] for e in evals), default=None)
        raise RuntimeError(f"{contender} on {workload} did not reach {w['metric']} "
                           f"{w['target']} (best {best}, exit {process.returncode}); "
                           f"see {log.name}.")
    return {"seconds": hit[0] - start, "step": int(hit[1]), "value": hit[2],
            "curve": [(round(t - start, 2), int(s), v) for t, s, v in evals]}


def ratio_row(workload, runs):
    t = [r["seconds"] for r in runs["trainer"]]
    f = [r["seconds"] for r in runs["fit"]]
    ratios = [a / b for a, b in zip(t, f)]
    w = WORKLOADS[workload]
    return (f"| {workload} | {w['metric']} {'<=' if w['mode'] == 'min' else '>='} "
            f"{w['target']} | {statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f}) | "
            f"{statistics.median(f):.1f} ({min(f):.1f}-{max(f):.1f}) | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{statistics.median(r['step'] for r in runs['trainer']):.0f} / "
            f"{statistics.median(r['step'] for r in runs['fit']):.0f} |")


def benchmark():
    if FLAGS.target is not None:
        if len(FLAGS.workloads) != 1:
            raise app.UsageError("--target is for one workload: name it with --workloads.")
        WORKLOADS[FLAGS.workloads[0]]["target"] = FLAGS.target
    os.makedirs(FLAGS.out, exist_ok=True)
    out = os.path.abspath(FLAGS.out)
    results = {}
    for workload in FLAGS.workloads:
        data_dir = (write_digits(os.path.join(out, "digits_data"))
                    if workload in ("cnn", "digits") else "")
        runs = {"trainer": [], "fit": []}
        for repeat in range(FLAGS.repeats):
            for contender in runs:
                workdir = os.path.join(out, workload, f"{contender}_{repeat}")
                subprocess.run(["rm", "-rf", workdir, workdir + ".user"], check=True)
                run = run_once(contender, workload, data_dir, workdir)
                logging.info("%s %s repeat %d: %.1f s to step %d (%s %.4f)", workload,
                             contender, repeat, run["seconds"], run["step"],
                             WORKLOADS[workload]["metric"], run["value"])
                runs[contender].append(run)
        results[workload] = runs
    table = ["| workload | target | Trainer s (min-max) | fit s (min-max) | Trainer / fit "
             "(min-max) | steps to target T / fit |", "|---|---|---|---|---|---|"]
    table += [ratio_row(workload, runs) for workload, runs in results.items()]
    report = (f"## Time to accuracy, {FLAGS.repeats} repeats (median, min-max)\n\n"
              + "\n".join(table) + "\n")
    print(report)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"workloads": {k: WORKLOADS[k] for k in results},
                   "runs": results}, f, indent=1)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report)


def eval_log(workdir, steps_per_epoch, task):
    """A Keras callback that appends each epoch's validation metrics (with those the task
    derives from them), the wall time and the step, to `workdir/fit_evals.jsonl`
    (the parent polls it)."""
    import keras
    from trainer.step.evaluation import with_derived_metrics

    def on_epoch_end(epoch, logs):
        row = {"time": time.time(), "step": (epoch + 1) * steps_per_epoch}
        row.update(with_derived_metrics(task, {k[len("val_"):]: float(v) for k, v in
                                               logs.items() if k.startswith("val_")}))
        with open(os.path.join(workdir, FIT_LOG), "a") as f:
            f.write(json.dumps(row) + "\n")
    return keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end)


def fit_run(config, workdir):
    """The same task, model, optimizer, schedule and precision through `model.fit`."""
    os.makedirs(workdir, exist_ok=True)
    every = config.trainer.eval_every
    task, model, train, evaluation = fit_setup(config, every)
    model.fit(train, validation_data=evaluation, steps_per_epoch=every,
              epochs=config.trainer.train_steps // every, verbose=2,
              callbacks=[eval_log(workdir, every, task)])


def main(argv):
    del argv
    if FLAGS.fit_workdir:
        fit_run(FLAGS.config, FLAGS.fit_workdir)
    else:
        benchmark()


if __name__ == "__main__":
    app.run(main)
