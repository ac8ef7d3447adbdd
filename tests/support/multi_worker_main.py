"""One worker of the multi-worker tests: trains a tiny CIFAR run, dumps its weights.

Usage (TF_CONFIG set by the test):
    python tests/support/multi_worker_main.py WORKDIR OUT.npz STEPS [STOP_AT [ACCUMULATION_STEPS]]
"""

import os
import sys

# The repository; this file's folder (tests/support/) is on sys.path as the script's,
# where the config's actions find `multi_worker_main`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

import keras  # noqa: E402
from absl import logging  # noqa: E402
import numpy as np  # noqa: E402

from trainer.task import get_task  # noqa: E402
from configs import cifar  # noqa: E402
from trainer import Trainer  # noqa: E402
from trainer.loop.action import Action  # noqa: E402
from trainer.runtime.distribute import build_strategy  # noqa: E402
from trainer.runtime.precision import set_policy  # noqa: E402


def record_step(controller, step, logs, path):
    """A user action from the config: appends the step to this worker's own file."""
    with open(path, "a") as f:
        f.write(f"{step}\n")


class StopOnChief(Action):
    """Asks, on the chief alone, to stop at `step`: every worker must stop with it."""

    chief_only = True

    def __init__(self, step):
        self.every = step

    def __call__(self, controller, step, logs):
        controller.request_stop(f"asked on the chief at step {step}")


def worker_config(steps, accumulation_steps=1):
    """A tiny CIFAR run; with accumulation, an EMA too and the same 32 examples a step."""
    c = cifar.get_config()
    c.precision = "float32"
    c.distribution.strategy = "multi_worker"
    c.distribution.collective_timeout_seconds = 30
    c.data.update(source="synthetic", synthetic_train_size=512, synthetic_test_size=64,
                  global_batch_size=32)
    c.trainer.update(train_steps=int(steps), steps_per_loop=5, log_every=5, eval_every=10,
                     checkpoint_every=10, jit_compile="off")  # compared with other runs
    if int(accumulation_steps) > 1:
        c.trainer.accumulation_steps = int(accumulation_steps)
        c.data.global_batch_size //= int(accumulation_steps)
        c.optimizer.ema_decay = 0.9
    return c


def main(workdir, out, steps, stop_at=None, accumulation_steps=1):
    logging.set_verbosity(logging.INFO)
    c = worker_config(steps, accumulation_steps)
    c.actions.record = dict(action="multi_worker_main.record_step", every=5,
                            path=out + ".steps")
    if stop_at:
        c.actions.stop = dict(action="multi_worker_main.StopOnChief", step=int(stop_at))
    strategy = build_strategy(c.distribution)
    keras.utils.set_random_seed(c.seed)
    set_policy(c.precision, strategy)
    trainer = Trainer(c, get_task(c), strategy, workdir)
    trainer.train()
    averages = trainer.ema.averages if trainer.ema else []
    np.savez(out, step=trainer.step.numpy(),
             **{f"w{i}": w.numpy() for i, w in enumerate(trainer.model.weights)},
             **{f"ema{i}": a.numpy() for i, a in enumerate(averages)})


if __name__ == "__main__":
    main(*sys.argv[1:])
