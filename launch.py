"""Entry point: python launch.py --config=configs/cifar.py --workdir=runs/cifar

Builds the strategy, sets the precision policy, builds the task and hands
both to the Trainer. Any config field can be overridden, e.g.
--config.trainer.train_steps=200 --config.precision=mixed_bfloat16.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

import tasks
from trainer import Trainer
from trainer.distribute import build_strategy, is_chief
from trainer.precision import set_policy
from trainer.trainer import Preempted
from trainer.workdir import WorkdirLock, check_workdir

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (a get_config() module).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, summaries and config.json.")
flags.DEFINE_enum("mode", "train_and_eval", ["train", "eval", "train_and_eval", "sample"],
                  "train: train only; eval: evaluate the latest checkpoint; "
                  "train_and_eval: train, evaluating every trainer.eval_every steps; "
                  "sample: print text from the latest checkpoint (language models).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        execute(FLAGS.config, FLAGS.workdir, FLAGS.mode)
    except Preempted as e:  # on every worker alike: the same message and exit status
        logging.warning("%s", e)
        logging.flush()
        sys.exit(128 + e.signum)


def execute(config, workdir, mode):
    """Runs `mode` on `workdir` (any filesystem tf.io.gfile knows: a path, gs://, ram://)."""
    import keras  # after flag parsing: keeps --help fast
    strategy = build_strategy(config.distribution)  # first: multi-worker needs a fresh runtime
    keras.utils.set_random_seed(config.seed)
    if mode == "sample" or not is_chief(strategy):
        run(config, strategy, workdir, mode)  # reads the workdir only / not the chief: no lock
        return
    check_workdir(workdir)
    with WorkdirLock(workdir):
        run(config, strategy, workdir, mode)


def run(config, strategy, workdir, mode):
    set_policy(config.precision, strategy)
    task = tasks.get_task(config)
    trainer = Trainer(config, task, strategy, workdir)
    if mode in ("eval", "sample"):
        if mode == "sample" and not hasattr(task, "sample"):
            raise ValueError(f"--mode=sample: task {config.task.name!r} cannot generate text.")
        if not trainer.restore():
            raise FileNotFoundError(
                f"--mode={mode}: no checkpoint in {workdir}/checkpoints. Train "
                "first (--mode=train_and_eval) or point --workdir at a trained run.")
        if mode == "eval":
            trainer.evaluate()
        else:
            s = config.sample
            prompt = s.prompt.encode()
            text = task.sample(trainer.model, prompt, s.num_bytes, s.temperature, s.top_k, s.seed)
            print((prompt + text).decode("utf-8", errors="replace"))
    else:
        trainer.train(evaluate=mode == "train_and_eval")


if __name__ == "__main__":
    app.run(main)
