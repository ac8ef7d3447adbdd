"""What a checkpoint costs the training loop: blocking saves against asynchronous ones.

python -m benchmarks.checkpoint_stall --config=lm --out=bench/stall_lm
python -m benchmarks.checkpoint_stall --config=resnet --out=bench/stall_resnet

One process, the config's model and optimizer as shipped (ResNet on synthetic
CIFAR-shaped data, the byte LM on its stdlib corpus). Each round runs
`--chunks` compiled chunks of `--steps` steps three ways, in turn: no save,
a save after every chunk with `trainer.async_checkpoint=off`, the same with
`on`. The stall per checkpoint is (round time - the no-save round's time) /
chunks: what the loop loses to one save, the background write's competition
for the CPU included. Also the time of the `save()` call alone. Median and
min-max over `--repeats` rounds.
"""

import contextlib
import json
import os
import statistics
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("config", "lm", ["lm", "resnet"], "Which shipped model.")
flags.DEFINE_integer("steps", 20, "Steps per compiled chunk.")
flags.DEFINE_integer("chunks", 5, "Chunks (and saves) per round.")
flags.DEFINE_integer("repeats", 3, "Rounds per mode.")
flags.DEFINE_string("out", "bench_stall", "Output directory.")
flags.DEFINE_bool("tiny", False, "A tiny model and corpus: checks the harness, measures nothing.")

MODES = ("none", "off", "on")


def build(mode, workdir):
    import keras
    import tensorflow as tf

    import configs.cifar
    import configs.lm
    from trainer.task import get_task
    from trainer import Trainer
    from trainer.runtime.precision import set_policy
    config = (configs.lm if FLAGS.config == "lm" else configs.cifar).get_config()
    if FLAGS.config == "resnet":  # with Adam, as its figures in docs/results.md were measured
        config.model.name = "resnet"
        config.data.source = "synthetic"
    if FLAGS.tiny:
        config.data.global_batch_size = 8
        if FLAGS.config == "lm":
            config.model.update(seq_len=16, num_layers=1, d_model=16, num_heads=2, mlp_dim=32)
            config.data.max_bytes = 100_000
        else:
            config.model.update(width=4, blocks_per_stage=1)
            config.data.update(synthetic_train_size=64, synthetic_test_size=16)
    config.distribution.strategy = "default"
    config.trainer.async_checkpoint = "on" if mode == "on" else "off"
    config.trainer.max_to_keep = 2
    strategy = tf.distribute.get_strategy()
    set_policy(config.precision, strategy)
    keras.utils.set_random_seed(config.seed)
    return Trainer(config, get_task(config), strategy, workdir)


def main(argv):
    import tensorflow as tf
    os.makedirs(FLAGS.out, exist_ok=True)
    runs = {}
    workdirs = contextlib.ExitStack()  # removed at the end
    for mode in MODES:
        trainer = build(mode, workdirs.enter_context(tempfile.TemporaryDirectory()))
        iterator = iter(trainer.distributed_dataset("train"))
        steps = tf.constant(FLAGS.steps, tf.int64)
        trainer.train_loop(iterator, steps)  # compile
        trainer.checkpoints.save()  # the first async save sets up its host copies
        trainer.checkpoints.sync()
        runs[mode] = (trainer, iterator, steps)
    rounds = {m: [] for m in MODES}
    save_calls = {m: [] for m in MODES[1:]}
    for _ in range(FLAGS.repeats):
        for mode in MODES:  # in turn, so drift spreads over all three
            trainer, iterator, steps = runs[mode]
            start = time.perf_counter()
            for _ in range(FLAGS.chunks):
                trainer.train_loop(iterator, steps)
                trainer.step.numpy()
                if mode != "none":
                    t = time.perf_counter()
                    trainer.checkpoints.save()
                    save_calls[mode].append(time.perf_counter() - t)
            trainer.checkpoints.sync()  # the last write counts too
            rounds[mode].append(time.perf_counter() - start)
    base = statistics.median(rounds["none"])
    size = sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(
        os.path.join(runs["off"][0].checkpoints.directory, "ckpt-*")))
    result = {"config": FLAGS.config, "steps_per_chunk": FLAGS.steps,
              "checkpoints_bytes": size, "step_seconds": base / (FLAGS.chunks * FLAGS.steps)}
    for mode in MODES[1:]:
        stalls = [(r - base) / FLAGS.chunks for r in rounds[mode]]
        result[f"async_{mode}"] = {
            "stall_seconds_per_checkpoint": round(statistics.median(stalls), 4),
            "stall_min_max": [round(min(stalls), 4), round(max(stalls), 4)],
            "save_call_seconds": round(statistics.median(save_calls[mode]), 4)}
    for trainer, _, _ in runs.values():
        trainer.checkpoints.sync()
    workdirs.close()
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    app.run(main)
