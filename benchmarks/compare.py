"""Trainer vs Keras model.fit vs a bare tf.function loop, precision by precision.

python -m benchmarks.compare --task=cifar10 --model=seed_cnn --out=bench/cnn
python -m benchmarks.compare --task=lm --out=bench/lm
python -m benchmarks.compare --task=vit --out=bench/vit

One process, the same model, batches, optimizer and precision for every
contender. After a warm-up round, each repeat runs every contender once in
turn (A B C A B C ...) so machine drift spreads over all of them; the table
gives the median and the min-max spread of examples/sec (and tokens/sec for
the LM). Writes results.json, results.md and results.png to --out.
"""

import json
import os
import resource
import statistics
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_enum("task", "cifar10", ["cifar10", "lm", "vit"], "Which model family.")
flags.DEFINE_string("model", "seed_cnn", "cifar10 model: seed_cnn or resnet.")
flags.DEFINE_list("precisions", None, "Default: float32,mixed_bfloat16 on CPU, "
                  "plus mixed_float16 on GPU.")
flags.DEFINE_bool("fp16_on_cpu", False, "Also measure mixed_float16 on a CPU (~200x slower).")
flags.DEFINE_integer("batch", 0, "Global batch size (0: the config's).")
flags.DEFINE_integer("steps", 30, "Steps per timed run.")
flags.DEFINE_integer("repeats", 5, "Timed runs per contender.")
flags.DEFINE_list("fit_steps_per_execution", ["1", "10", "50"], "model.fit settings tried.")
flags.DEFINE_list("steps_per_loop", ["1", "10", "100"], "Trainer settings for the sweep.")
flags.DEFINE_bool("sweeps", True, "Also the steps_per_loop, input pipeline and step-option "
                  "tables (--nosweeps: the precisions' table only).")
flags.DEFINE_bool("tiny", False, "A tiny model and data: a smoke test of the harness.")
flags.DEFINE_string("out", "bench_out", "Output directory.")

IN_MEMORY_BATCHES = 8


def make_config():
    """The task's own config, adjusted for benchmarking on synthetic/offline data."""
    import configs.cifar
    import configs.lm
    import configs.vit_cifar
    config = {"cifar10": configs.cifar, "lm": configs.lm, "vit": configs.vit_cifar}[
        FLAGS.task].get_config()
    config.distribution.strategy = "auto"
    if FLAGS.task == "cifar10":
        config.model.name = FLAGS.model
    if FLAGS.task != "lm":  # synthetic images, written and read back in CIFAR's real format
        from trainer.data.images import cifar10 as cifar10_data
        folder = os.path.join(FLAGS.out, "cifar_files", cifar10_data.FOLDER)
        cifar10_data.write_folder(cifar10_data.synthetic(4096, 64), folder)
        config.data.update(source="cifar10", data_dir=os.path.dirname(folder))
    else:
        config.data.max_bytes = 4_000_000
    if FLAGS.batch:
        config.data.global_batch_size = FLAGS.batch
    if FLAGS.tiny:
        config.data.global_batch_size = 16
        config.trainer.steps_per_loop = 2  # each timed Trainer run is a whole host call
        if FLAGS.task == "lm":
            config.model.update(seq_len=32, num_layers=1, d_model=32, num_heads=2, mlp_dim=64)
            config.data.max_bytes = 100_000
        elif FLAGS.task == "vit":
            config.model.update(num_layers=1, d_model=32, num_heads=2, mlp_dim=64)
    config.optimizer.update(schedule="constant", clip_norm=0.0)  # the same for all contenders
    config.trainer.update(train_steps=10**9, log_every=10**9, checkpoint_every=10**9,
                          eval_every=0, per_step_summaries=False)
    return config


class InMemoryTask:
    """Wraps a task so its train input is a fixed set of batches held in memory."""

    def __init__(self, task, batches):
        self._task, self._batches = task, batches
        self.config, self.tokens_per_example = task.config, task.tokens_per_example

    def __getattr__(self, name):
        return getattr(self._task, name)

    def build_inputs(self, split, input_context, start_step=0):
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices(self._batches).repeat()


def in_memory_batches(task, strategy):
    """IN_MEMORY_BATCHES per-replica batches from the task's own train pipeline."""
    import tensorflow as tf
    ctx = tf.distribute.InputContext(1, 0, strategy.num_replicas_in_sync)
    return next(iter(task.build_inputs("train", ctx).batch(IN_MEMORY_BATCHES)))


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Contender:
    """Runs `steps` training steps per call of `run`, which returns the seconds taken.

    `steps` is FLAGS.steps rounded up to a multiple of the steps the contender
    runs per host call, so no call runs a partial chunk. `batches_per_step`:
    batches of the global batch size one step reads (accumulation).
    """

    def __init__(self, name, run, steps_per_call=1, batches_per_step=1):
        self.name, self.run, self.seconds, self.rss_growth_mb = name, run, [], 0.0
        self.steps = -(-FLAGS.steps // steps_per_call) * steps_per_call
        self.batches_per_step = batches_per_step


def trainer_contender(name, config, task, strategy, steps_per_loop, workdir, overrides=()):
    """The Trainer's compiled loop, and the per-step summaries' writes when they are on
    (as in a real run). `overrides`: {"section.field": value} to change in the config."""
    import tensorflow as tf
    from trainer import Trainer
    from trainer.runtime.summaries import Summaries
    config = config.copy_and_resolve_references()
    config.trainer.steps_per_loop = steps_per_loop
    for key, value in dict(overrides).items():
        section, field = key.split(".")
        config[section][field] = value
    trainer = Trainer(config, task, strategy, workdir)
    summaries = Summaries(workdir, trainer.is_chief)
    iterator = iter(trainer.distributed_dataset("train"))

    def run(steps):
        t0 = time.perf_counter()
        for _ in range(steps // steps_per_loop):
            first_step = int(trainer.step.numpy()) + 1
            out = trainer.train_loop(iterator, tf.constant(steps_per_loop, tf.int64))
            if "per_step" in out:
                summaries.per_step("train", trainer.PER_STEP_SCALARS, out["per_step"],
                                   first_step)
        trainer.step.numpy()  # wait for the device
        return time.perf_counter() - t0
    return Contender(name, run, steps_per_loop, trainer.accumulation_steps)


def fit_contender(config, task, strategy, batches, steps_per_execution):
    import tensorflow as tf
    from trainer.step.optimizers import build_optimizer
    with strategy.scope():
        model = task.build_model()
        model.compile(optimizer=build_optimizer(config.optimizer, 10**9),
                      loss=task.compute_loss, steps_per_execution=steps_per_execution,
                      jit_compile=False)
    dataset = tf.data.Dataset.from_tensor_slices(batches).repeat()

    def run(steps):
        t0 = time.perf_counter()
        model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        return time.perf_counter() - t0
    return Contender(f"fit spe={steps_per_execution}", run, steps_per_execution)


def bare_contender(config, task, strategy, batches):
    """The minimal tf.function step: forward, loss, tape.gradient, apply."""
    import tensorflow as tf
    from trainer.step.optimizers import build_optimizer
    with strategy.scope():
        model = task.build_model()
        optimizer = build_optimizer(config.optimizer, 10**9)
    iterator = iter(tf.data.Dataset.from_tensor_slices(batches).repeat())

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            loss = tf.reduce_mean(task.compute_loss(labels, tf.cast(outputs, tf.float32)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    def run(steps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step(*next(iterator))
        optimizer.iterations.numpy()
        return time.perf_counter() - t0
    return Contender("bare loop", run)


def measure(contenders, repeats):
    """Warm-up round, then `repeats` rounds alternating the contenders."""
    for c in contenders:
        before = peak_rss_mb()
        c.run(c.steps)
        c.rss_growth_mb = peak_rss_mb() - before
    for _ in range(repeats):
        for c in contenders:
            c.seconds.append(c.run(c.steps))


def summarize(c, batch, tokens_per_example):
    rates = sorted(c.steps * c.batches_per_step * batch / s for s in c.seconds)
    row = {"contender": c.name, "examples_per_sec": statistics.median(rates),
           "min": rates[0], "max": rates[-1], "peak_rss_growth_mb": round(c.rss_growth_mb, 1)}
    if tokens_per_example:
        row["tokens_per_sec"] = row["examples_per_sec"] * tokens_per_example
    return row


def run_precision(precision, config, strategy, workdir):
    import keras
    from trainer.task import get_task
    from trainer.runtime.precision import set_policy
    set_policy(precision, strategy)
    keras.utils.set_random_seed(config.seed)
    task = get_task(config)
    batches = in_memory_batches(task, strategy)
    memory_task = InMemoryTask(task, batches)
    spl = config.trainer.steps_per_loop
    contenders = [trainer_contender(f"Trainer spl={spl}", config, memory_task, strategy, spl,
                                    os.path.join(workdir, precision, "trainer"))]
    contenders += [fit_contender(config, task, strategy, batches, int(k))
                   for k in FLAGS.fit_steps_per_execution]
    contenders.append(bare_contender(config, task, strategy, batches))
    measure(contenders, FLAGS.repeats)
    batch = config.data.global_batch_size
    return [summarize(c, batch, task.tokens_per_example) for c in contenders], task


def run_sweeps(config, strategy, task, workdir):
    """Trainer steps_per_loop sweep and real input pipeline vs in-memory batches."""
    memory_task = InMemoryTask(task, in_memory_batches(task, strategy))
    sweep = [trainer_contender(f"Trainer spl={k}", config, memory_task, strategy, int(k),
                               os.path.join(workdir, "sweep", k))
             for k in FLAGS.steps_per_loop]
    spl = config.trainer.steps_per_loop
    pipeline = [trainer_contender("in-memory batches", config, memory_task, strategy, spl,
                                  os.path.join(workdir, "pipe", "mem")),
                trainer_contender("real input pipeline", config, task, strategy, spl,
                                  os.path.join(workdir, "pipe", "real"))]
    # The same micro-batch everywhere: what accumulation, per-step summaries, EMA cost.
    features = [trainer_contender(name, config, memory_task, strategy, spl,
                                  os.path.join(workdir, "features", str(i)), overrides)
                for i, (name, overrides) in enumerate([
                    ("plain", {}),
                    ("accumulation_steps=4", {"trainer.accumulation_steps": 4}),
                    ("per-step summaries", {"trainer.per_step_summaries": True}),
                    ("EMA 0.999", {"optimizer.ema_decay": 0.999})])]
    measure(sweep, FLAGS.repeats)
    measure(pipeline, FLAGS.repeats)
    measure(features, FLAGS.repeats)
    batch = config.data.global_batch_size
    return tuple([summarize(c, batch, task.tokens_per_example) for c in contenders]
                 for contenders in (sweep, pipeline, features))


def markdown(title, rows, ratio_to=None):
    rate = "tokens_per_sec" if "tokens_per_sec" in rows[0] else "examples_per_sec"
    unit = "tokens/s" if rate == "tokens_per_sec" else "ex/s"
    lines = [f"### {title}", "", f"| contender | {unit} (median) | min-max | ratio | peak RSS "
             "growth MB |", "|---|---|---|---|---|"]
    base = rows[0][rate] if ratio_to is None else ratio_to
    for r in rows:
        scale = r[rate] / r["examples_per_sec"]
        lines.append(f"| {r['contender']} | {r[rate]:,.0f} | {r['min'] * scale:,.0f}-"
                     f"{r['max'] * scale:,.0f} | {r[rate] / base:.2f} | "
                     f"{r['peak_rss_growth_mb']} |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    precisions = list(results["precisions"])
    names = [r["contender"] for r in results["precisions"][precisions[0]]]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(precisions)
    for i, p in enumerate(precisions):
        values = [r["examples_per_sec"] for r in results["precisions"][p]]
        ax.bar([x + i * width for x in range(len(names))], values, width, label=p)
    ax.set_xticks([x + width * (len(precisions) - 1) / 2 for x in range(len(names))], names)
    ax.set_ylabel("examples / sec")
    ax.set_title(f"{results['task']} ({results['model']}), batch {results['batch']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def run_all_sweeps(config, strategy, precisions, workdir, results, text):
    """The sweeps' tables, at the fastest precision measured (not float16 on a CPU)."""
    sweep_precision = precisions[-1] if precisions[-1] != "mixed_float16" else precisions[0]
    from trainer.runtime.precision import set_policy
    set_policy(sweep_precision, strategy)
    from trainer.task import get_task
    sweep, pipeline, features = run_sweeps(config, strategy, get_task(config), workdir)
    results["steps_per_loop"] = sweep
    results["input_pipeline"] = pipeline
    results["features"] = features
    text.append(markdown(f"Trainer steps_per_loop ({sweep_precision})", sweep))
    text.append(markdown(f"Input pipeline ({sweep_precision}): ratio to in-memory", pipeline))
    text.append(markdown(f"Accumulation, per-step summaries, EMA ({sweep_precision}, the same "
                         "micro-batch, every micro-batch counted): ratio to plain", features))


def main(argv):
    del argv
    import tensorflow as tf
    from trainer.runtime.distribute import build_strategy
    os.makedirs(FLAGS.out, exist_ok=True)
    config = make_config()
    strategy = build_strategy(config.distribution)
    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    precisions = FLAGS.precisions or (["float32", "mixed_bfloat16"]
                                      + (["mixed_float16"] if on_gpu or FLAGS.fp16_on_cpu
                                         else []))
    workdir = os.path.join(FLAGS.out, "workdirs")
    results = {"task": FLAGS.task, "model": FLAGS.model if FLAGS.task == "cifar10"
               else FLAGS.task, "batch": config.data.global_batch_size,
               "steps": FLAGS.steps, "repeats": FLAGS.repeats, "precisions": {}}
    text = []
    for precision in precisions:
        rows, task = run_precision(precision, config, strategy, workdir)
        results["precisions"][precision] = rows
        text.append(markdown(f"{precision}: ratios to the Trainer", rows))
    trainer_rates = {p: rows[0]["examples_per_sec"] for p, rows in results["precisions"].items()}
    if "float32" in trainer_rates:
        results["speedup_vs_float32"] = {p: r / trainer_rates["float32"]
                                         for p, r in trainer_rates.items()}
        text.append("Trainer speed-up over float32: " + ", ".join(
            f"{p} {s:.2f}x" for p, s in results["speedup_vs_float32"].items()) + "\n")
    if FLAGS.sweeps:
        run_all_sweeps(config, strategy, precisions, workdir, results, text)
    report = f"## {results['task']} / {results['model']}, global batch {results['batch']}, " \
             f">= {FLAGS.steps} steps x {FLAGS.repeats} repeats\n\n" + "\n".join(text)
    print(report)
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(FLAGS.out, "results.md"), "w") as f:
        f.write(report)
    plot(results, os.path.join(FLAGS.out, "results.png"))
    logging.info("Wrote %s/results.{json,md,png}", FLAGS.out)


if __name__ == "__main__":
    app.run(main)
