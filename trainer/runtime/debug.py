"""`trainer.debug`: the steps run eagerly, so that pdb, print and Python exceptions work
inside a Task and a model ("eager"), or TensorFlow Debugger V2 data of the steps
`trainer.debug_steps` for TensorBoard's Debugger V2 tab ("dump",
trainer/actions/debug_dump.py). docs/precision.md#debug-modes."""

import os

import tensorflow as tf
from absl import logging

MODES = ("", "eager", "dump")
DUMP_DIR = "debug"  # in the workdir: tensorboard --logdir=<workdir>/debug
# The most a dump records per tensor without copying it: counts of -inf, +inf, NaN,
# negative, zero and positive entries, its dtype, rank and size.
TENSOR_DEBUG_MODE = "FULL_HEALTH"


def check_debug(tc):
    """Fails on `trainer.debug` / `trainer.debug_steps` values it cannot run."""
    if tc.debug not in MODES:
        raise ValueError(f"trainer.debug={tc.debug!r} must be '' (off), 'eager' or 'dump'.")
    steps = tuple(tc.debug_steps)
    if tc.debug == "dump" and not (
            len(steps) == 2 and all(isinstance(s, int) and not isinstance(s, bool)
                                    for s in steps) and 1 <= steps[0] <= steps[1]):
        raise ValueError(f"trainer.debug_steps={tc.debug_steps!r} must be (first, last) "
                         "steps with 1 <= first <= last, e.g. "
                         "--config.trainer.debug_steps='(100, 102)'.")


def one_replica(distribution):
    """Under `trainer.debug=eager`, makes `config.distribution` one replica in this
    process (the default strategy), refusing what cannot run eagerly."""
    if distribution.strategy == "tpu" or distribution.tpu or os.environ.get("TPU_NAME"):
        raise ValueError("trainer.debug=eager cannot run on a TPU, which runs compiled "
                         "programs only; debug on a CPU or GPU, or use "
                         "--config.trainer.debug=dump.")
    if os.environ.get("TF_CONFIG") or distribution.cluster == "slurm" or \
            distribution.strategy == "multi_worker":
        raise ValueError("trainer.debug=eager runs one process on one replica; launch it "
                         "without TF_CONFIG, Slurm or --local_workers, or use "
                         "--config.trainer.debug=dump.")
    distribution.strategy = "default"


def start(tc, strategy):
    """Applies `trainer.debug` for a Trainer on `strategy`."""
    check_debug(tc)
    if tc.debug != "eager":
        return
    if isinstance(strategy, tf.distribute.TPUStrategy) or strategy.num_replicas_in_sync > 1:
        raise ValueError(f"trainer.debug=eager runs on one replica, not "
                         f"{strategy.num_replicas_in_sync} ({type(strategy).__name__}); set "
                         "--config.distribution.strategy=default.")
    tf.config.run_functions_eagerly(True)
    logging.warning("trainer.debug=eager: the train and eval steps run eagerly, op by op, "
                    "on one replica, without XLA: many times slower than compiled. pdb, "
                    "print and Python exceptions work inside the Task and the model "
                    "(tf.data's functions still run as graphs).")
