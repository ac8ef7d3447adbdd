"""Two local workers: the bytes each all-reduce option moves per step, and what they learn.

python -m benchmarks.multi_worker                       # both tables
python -m benchmarks.multi_worker --tables=traffic --models=resnet --steps=40

traffic: for each `distribution.all_reduce` / `bytes_per_pack` / `all_reduce_dtype`
setting, `launch.py --local_workers=2` trains `--steps` steps on synthetic CIFAR-sized
images; an action on the chief records the loopback interface's transmitted bytes
(/proc/net/dev: both workers' traffic, each byte once) and the clock at every log step.
Bytes and seconds per step are taken between the first log step (after the compiling
chunk) and the last. One process on the same machine is the step-time baseline. On
localhost the network costs nothing: the step time shows the compute, not the wire.

learning: the ResNet on the images of benchmarks/input.py (scikit-learn's digits,
enlarged, tinted, shifted and noised; `pip install -e .[bench]`) in CIFAR format, as
one process and as 2 workers, and one process with another seed (the noise).
Writes results.json and results.md to --out.
"""

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from benchmarks.scratch import fresh_directory

FLAGS = flags.FLAGS
flags.DEFINE_list("tables", ["traffic", "learning"], "traffic and/or learning.")
flags.DEFINE_list("models", ["seed_cnn", "resnet"], "Models of the traffic table.")
flags.DEFINE_integer("steps", 60, "Train steps per traffic run (recorded every 10).")
flags.DEFINE_integer("batch", 128, "Global batch size.")
flags.DEFINE_integer("learning_steps", 320, "Train steps of the learning runs.")
flags.DEFINE_string("data", "", "The images of benchmarks/input.py ('': --out/data).")
flags.DEFINE_string("out", "bench_multi_worker", "Output directory.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (all_reduce, bytes_per_pack, all_reduce_dtype); nccl without GPUs is TensorFlow's ring
OPTIONS = [("auto", 0, "float32"), ("ring", 0, "float32"), ("ring", 262144, "float32"),
           ("nccl", 0, "float32"), ("ring", 0, "bfloat16")]
EVERY = 10

CONFIG = """
from configs import cifar


def get_config():
    c = cifar.get_config()
    c.actions.traffic = dict(action="benchmarks.multi_worker.record_traffic", every={every},
                             path={path!r})
    return c
"""


def loopback_bytes():
    """Bytes transmitted on the loopback interface since boot."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[8])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def record_traffic(controller, step, logs, path):
    """A config action: the chief appends (step, clock, loopback bytes)."""
    if controller.is_chief:
        with open(path, "a") as f:
            f.write(json.dumps([step, time.monotonic(), loopback_bytes()]) + "\n")


def launch(args, log):
    with open(log, "w") as out:
        rc = subprocess.call([sys.executable, "launch.py", *args], cwd=REPO, stdout=out,
                             stderr=subprocess.STDOUT,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if rc:
        with open(log) as f:
            raise RuntimeError(f"launch.py {' '.join(args)} failed ({rc}):\n" + f.read()[-3000:])


def traffic(model, option, workers):
    name = f"{model}_{'_'.join(map(str, option))}_{workers}w"
    run_dir = fresh_directory(os.path.join(FLAGS.out, "runs", name))
    records = os.path.join(run_dir, "traffic.jsonl")
    config = os.path.join(run_dir, "config.py")
    with open(config, "w") as f:
        f.write(CONFIG.format(every=EVERY, path=records))
    all_reduce, bytes_per_pack, dtype = option
    args = [f"--config={config}", f"--workdir={run_dir}/wd", "--mode=train",
            f"--config.model.name={model}", "--config.data.source=synthetic",
            "--config.data.synthetic_train_size=8192", "--config.data.synthetic_test_size=256",
            f"--config.data.global_batch_size={FLAGS.batch}",
            f"--config.trainer.train_steps={FLAGS.steps}",
            f"--config.trainer.steps_per_loop={EVERY}", f"--config.trainer.log_every={EVERY}",
            "--config.trainer.checkpoint_every=0", "--config.trainer.jit_compile=off",
            f"--config.distribution.all_reduce={all_reduce}",
            f"--config.distribution.bytes_per_pack={bytes_per_pack}",
            f"--config.distribution.all_reduce_dtype={dtype}"]
    if workers > 1:
        args.append(f"--local_workers={workers}")
    launch(args, os.path.join(run_dir, "log.txt"))
    with open(records) as f:
        rows = [json.loads(line) for line in f]
    (s0, t0, b0), (s1, t1, b1) = rows[0], rows[-1]
    return {"model": model, "workers": workers, "all_reduce": all_reduce,
            "bytes_per_pack": bytes_per_pack, "all_reduce_dtype": dtype,
            "bytes_per_step": (b1 - b0) / (s1 - s0), "seconds_per_step": (t1 - t0) / (s1 - s0)}


def gradient_bytes(model):
    """float32 bytes of the model's trainable variables (one gradient)."""
    import keras
    from trainer.task import get_task
    from configs import cifar
    c = cifar.get_config()
    c.model.name, c.data.source = model, "synthetic"
    keras_model = get_task(c).build_model()
    keras_model(keras.ops.zeros((1, 32, 32, 3)))
    return 4 * sum(int(v.numpy().size) for v in keras_model.trainable_variables)


def learning(root):
    """Eval accuracy of the ResNet as one process (two seeds) and as 2 workers."""
    rows = []
    for name, seed, workers in (("1 process", 0, 1), ("2 workers", 0, 2),
                                ("1 process, seed 1", 1, 1)):
        run_dir = fresh_directory(os.path.join(FLAGS.out, "runs",
                                               f"learning_{workers}w_seed{seed}"))
        args = ["--config=configs/cifar.py", f"--workdir={run_dir}", "--mode=train_and_eval",
                "--config.model.name=resnet", "--config.data.augment=True",
                "--config.data.source=cifar10", f"--config.data.data_dir={root}/cifar",
                f"--config.data.global_batch_size={FLAGS.batch}", f"--config.seed={seed}",
                f"--config.trainer.train_steps={FLAGS.learning_steps}",
                "--config.trainer.eval_every=0", "--config.trainer.checkpoint_every=0",
                "--config.trainer.jit_compile=off", "--config.optimizer.schedule=cosine",
                "--config.optimizer.warmup_steps=20"]
        if workers > 1:
            args.append(f"--local_workers={workers}")
        start = time.monotonic()
        launch(args, os.path.join(run_dir, "log.txt"))
        with open(os.path.join(run_dir, "summary.json")) as f:
            final = json.load(f)["eval"]
        rows.append({"run": name, "eval_accuracy": final["accuracy"], "eval_loss": final["loss"],
                     "seconds": time.monotonic() - start})
    return rows


def markdown(results):
    text = []
    if "traffic" in results:
        text += ["| model | workers | all_reduce | bytes_per_pack | dtype | MB/step "
                 "(loopback) | gradient MB | ms/step |", "|---|---|---|---|---|---|---|---|"]
        for r in results["traffic"]:
            text.append(f"| {r['model']} | {r['workers']} | {r['all_reduce']} | "
                        f"{r['bytes_per_pack']} | {r['all_reduce_dtype']} | "
                        f"{r['bytes_per_step'] / 1e6:.2f} | {r['gradient_bytes'] / 1e6:.2f} | "
                        f"{r['seconds_per_step'] * 1e3:.0f} |")
        text.append("")
    if "learning" in results:
        text += ["| run | eval accuracy | eval loss | seconds |", "|---|---|---|---|"]
        text += [f"| {r['run']} | {r['eval_accuracy']:.4f} | {r['eval_loss']:.4f} | "
                 f"{r['seconds']:.0f} |" for r in results["learning"]]
    return "\n".join(text)


def main(argv):
    del argv
    os.makedirs(FLAGS.out, exist_ok=True)
    results = {}
    if "traffic" in FLAGS.tables:
        rows = []
        for model in FLAGS.models:
            size = gradient_bytes(model)
            runs = [traffic(model, OPTIONS[0], 1)] + [traffic(model, o, 2) for o in OPTIONS]
            rows += [dict(r, gradient_bytes=size) for r in runs]
        results["traffic"] = rows
    if "learning" in FLAGS.tables:
        from benchmarks.image_files import write_data
        root = write_data(FLAGS.data or os.path.join(FLAGS.out, "data"), 20_000)
        results["learning"] = learning(root)
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    text = markdown(results)
    with open(os.path.join(FLAGS.out, "results.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    app.run(main)
