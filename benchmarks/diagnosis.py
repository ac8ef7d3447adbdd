"""What the divergence diagnosis costs (docs/results.md, "The divergence diagnosis"), on
configs/lm.py and configs/cifar_resnet.py:

- stop: a run trained to a checkpoint, relaunched with its optimizer at a learning rate
  of 1e30 (it diverges at once), then from the stop to the report: diagnosis.json's
  seconds, and what it names;
- per_step: in this process, on the config's model and batches, the compiled step of
  training (one step of the train loop) against the replay's step (the layer-by-layer
  inspection, then the train step on the batch it holds), medians of `--repeats`.

    python -m benchmarks.diagnosis --out=/tmp/diagnosis [--parts=lm_stop,lm_per_step,...]
"""

import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from absl import app, flags

from benchmarks.launched import REPO, flags_of, launch, run_parts

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "/tmp/diagnosis", "Where the runs and results.json go.")
flags.DEFINE_list("parts", ["lm_stop", "lm_per_step", "resnet_stop", "resnet_per_step"],
                  "Which measurements.")
flags.DEFINE_integer("repeats", 10, "Steps timed for the per-step medians.")

CONFIGS = {"lm": "lm", "resnet": "cifar_resnet"}
GOOD_STEPS = 20  # trained before the divergence, the last one checkpointed
# The config's own optimizer (its slots are in the checkpoint), at a rate that diverges.
DIVERGING = {"optimizer.clip_norm": 0.0, "optimizer.learning_rate": 1e30,
             "optimizer.schedule": "constant", "optimizer.warmup_steps": 0}


def stop(name, out):
    workdir = os.path.join(out, name)
    shutil.rmtree(workdir, ignore_errors=True)
    common = [f"--config=configs/{CONFIGS[name]}.py", "--mode=train", *flags_of({
        "trainer.steps_per_loop": 5, "trainer.log_every": 5, "trainer.eval_every": 0,
        "optimizer.warmup_steps": 2})]
    _, summary, _ = launch(common + flags_of({"trainer.train_steps": GOOD_STEPS,
                                              "trainer.checkpoint_every": GOOD_STEPS}),
                           workdir)
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "launch.py", *common, f"--workdir={workdir}",
         *flags_of(dict(DIVERGING, **{"trainer.train_steps": GOOD_STEPS + 20}))],
        cwd=REPO, capture_output=True, text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    seconds = time.monotonic() - started
    if run.returncode != 1 or not os.path.exists(os.path.join(workdir, "diagnosis.json")):
        raise RuntimeError(f"expected a diagnosed divergence: {run.stderr[-3000:]}")
    with open(os.path.join(workdir, "diagnosis.json")) as f:
        diagnosis = json.load(f)
    return {"precision": summary["precision"], "diverged_at": diagnosis["diverged_at"],
            "replayed_from": diagnosis["replayed_from_state"].rsplit("/", 1)[-1],
            "diagnosis_seconds": diagnosis["seconds"], "relaunch_seconds": round(seconds, 1),
            "layer": diagnosis.get("layer"), "pass": diagnosis.get("pass"),
            "op": (diagnosis.get("op") or {}).get("op"),
            "last_log_line": run.stderr.strip().splitlines()[-1][:600]}


def per_step(name, out):
    import keras
    import tensorflow as tf

    from trainer.runtime.precision import set_policy
    from trainer.step.inspection import StepInspection
    from trainer.step.trainer import Trainer
    from trainer.task import get_task

    config = importlib.import_module(f"configs.{CONFIGS[name]}").get_config()
    config.trainer.update(train_steps=1000, jit_compile="off")
    strategy = tf.distribute.get_strategy()
    set_policy(config.precision, strategy)
    keras.utils.set_random_seed(config.seed)
    task = get_task(config)
    task.prepare_data()
    trainer = Trainer(config, task, strategy, os.path.join(out, f"{name}_per_step"))
    iterator = iter(trainer.distributed_dataset("train"))
    one = tf.constant(1, tf.int64)
    inspection = StepInspection(trainer)
    step_fn = tf.function(lambda f, l: strategy.run(trainer.train_step, args=(f, l)),
                          autograph=False)

    def timed(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def replayed():
        features, labels = next(iterator)
        inspected = timed(lambda: inspection.inspect(
            features, labels, float(trainer.loss_scale.scale.numpy())))
        return inspected, timed(lambda: (step_fn(features, labels), trainer.step.numpy()))

    for _ in range(2):  # traces
        trainer.train_loop(iterator, one)
        replayed()
    loop = [timed(lambda: (trainer.train_loop(iterator, one), trainer.step.numpy()))
            for _ in range(FLAGS.repeats)]
    replay = [replayed() for _ in range(FLAGS.repeats)]
    compiled = statistics.median(loop)
    inspect, step = (statistics.median(x) for x in zip(*replay))
    return {"precision": trainer.policy, "layers_inspected": len(inspection.paths),
            "compiled_step_seconds": round(compiled, 4),
            "replay_inspection_seconds": round(inspect, 4),
            "replay_train_step_seconds": round(step, 4),
            "replay_step_over_compiled_step": round((inspect + step) / compiled, 2)}


def main(argv):
    del argv
    functions = {f"{name}_{what}": (lambda out, n=name, f=fn: f(n, out))
                 for name in CONFIGS for what, fn in (("stop", stop), ("per_step", per_step))}
    run_parts(FLAGS.parts, functions, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
