"""Learning parity: the Trainer's default CIFAR job vs the tutorial's `model.fit`.

python -m benchmarks.fit_parity --out=bench/parity                  # generated data
python -m benchmarks.fit_parity --data_dir=DIR --out=bench/parity   # real CIFAR-10

Both train the seed CNN from the same initial weights on the same data for
the same epochs, batch and optimizer (Adam 1e-3, float32, one device). The
Trainer runs `configs/cifar.py` as shipped (its normalization, stateless
shuffle and augmentation setting, input read from files in CIFAR-10's real
format); `model.fit` runs the tutorial's pipeline (pixels / 255, fit's own
shuffle). Each seed gives one pair of eval accuracies; the table shows them
and their difference. Without --data_dir the data is generated: a 10-class
task that is deliberately not easy (templates under heavy noise, shifted by
up to 4 pixels), so the accuracies sit far from 100% and differences show.
"""

import json
import os
import statistics

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", "", "A folder with CIFAR-10 (cifar-10-batches-py/ or the "
                    "tar.gz); empty: generated data.")
flags.DEFINE_integer("train_size", 20480, "Generated data: training images.")
flags.DEFINE_integer("test_size", 5000, "Generated data: test images.")
flags.DEFINE_integer("epochs", 3, "Epochs for both.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "One Trainer/fit pair per seed.")
flags.DEFINE_string("out", "bench_parity", "Output directory.")

BATCH = 512


def generated(num_train, num_test, seed=0):
    """A CIFAR-shaped 10-class task that a small CNN learns to roughly 70-90%."""
    import numpy as np
    from trainer.data.images import cifar10 as cifar10_data
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(10, 8, 8, 3)).astype(np.float32)
    templates = coarse.repeat(4, axis=1).repeat(4, axis=2)
    padded = np.pad(templates, [(0, 0), (4, 4), (4, 4), (0, 0)], mode="reflect")

    def make(n):
        labels = rng.integers(0, 10, size=n).astype(np.int32)
        dy, dx = rng.integers(0, 9, size=(2, n))
        images = np.stack([padded[c, y:y + 32, x:x + 32] for c, y, x in zip(labels, dy, dx)])
        noise = rng.standard_normal(size=images.shape, dtype=np.float32) * 130
        return np.clip(128 + 0.4 * (images - 128) + noise, 0, 255).astype(np.uint8), labels

    (xtr, ytr), (xte, yte) = make(num_train), make(num_test)
    return cifar10_data.Cifar10(xtr, ytr, xte, yte, source="generated parity data")


def trainer_config(data_dir, seed, num_train):
    import configs.cifar
    config = configs.cifar.get_config()  # as shipped, but for what a benchmark must pin
    config.seed = seed
    config.precision = "float32"
    config.distribution.strategy = "default"
    config.data.update(source="cifar10", data_dir=data_dir, global_batch_size=BATCH)
    steps = FLAGS.epochs * num_train // BATCH
    config.trainer.update(train_steps=steps, eval_every=0, checkpoint_every=0, log_every=0,
                          steps_per_loop=min(steps, 100))
    return config


def run_pair(data_dir, data, seed, workdir):
    """(Trainer eval accuracy, model.fit eval accuracy) from the same initial weights;
    `data` holds the arrays of `data_dir`, for model.fit."""
    import keras
    import tensorflow as tf
    from trainer.task import get_task
    from tasks.models.cnn import seed_cnn
    from trainer import Trainer
    from trainer.runtime.precision import set_policy

    strategy = tf.distribute.get_strategy()
    keras.utils.set_random_seed(seed)
    config = trainer_config(data_dir, seed, len(data.train_labels))
    set_policy(config.precision, strategy)
    trainer = Trainer(config, get_task(config), strategy, workdir)
    initial = trainer.model.get_weights()
    trainer_accuracy = trainer.train()["accuracy"]

    keras.utils.set_random_seed(seed)
    model = seed_cnn()
    model.set_weights(initial)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data.train_images / 255.0, data.train_labels, batch_size=BATCH,
              epochs=FLAGS.epochs, shuffle=True, verbose=0)
    _, fit_accuracy = model.evaluate(data.test_images / 255.0, data.test_labels,
                                     batch_size=BATCH, verbose=0)
    return trainer_accuracy, float(fit_accuracy)


def main(argv):
    del argv
    from trainer.data.images import cifar10 as cifar10_data
    os.makedirs(FLAGS.out, exist_ok=True)
    data_dir = FLAGS.data_dir
    if not data_dir:
        data_dir = os.path.join(FLAGS.out, "data")
        cifar10_data.write_folder(generated(FLAGS.train_size, FLAGS.test_size),
                                  os.path.join(data_dir, cifar10_data.FOLDER))
    data = cifar10_data.find_on_disk(data_dir)
    if data is None:
        raise FileNotFoundError(f"--data_dir={data_dir} holds no CIFAR-10.")
    rows = []
    for seed in map(int, FLAGS.seeds):
        trainer_acc, fit_acc = run_pair(data_dir, data, seed,
                                        os.path.join(FLAGS.out, f"run{seed}"))
        rows.append({"seed": seed, "trainer": trainer_acc, "fit": fit_acc,
                     "difference": trainer_acc - fit_acc})
        logging.info("seed %d: Trainer %.4f, model.fit %.4f", seed, trainer_acc, fit_acc)
    summary = {"data": FLAGS.data_dir or "generated", "epochs": FLAGS.epochs, "batch": BATCH,
               "rows": rows,
               "mean_difference": statistics.mean(r["difference"] for r in rows)}
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = ["| seed | Trainer (configs/cifar.py) | model.fit (tutorial) | difference |",
             "|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['trainer']:.4f} | {r['fit']:.4f} | {r['difference']:+.4f} |"
              for r in rows]
    lines.append(f"\nmean difference {summary['mean_difference']:+.4f} "
                 f"({FLAGS.epochs} epochs, batch {BATCH}, data: {summary['data']})")
    with open(os.path.join(FLAGS.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    app.run(main)
