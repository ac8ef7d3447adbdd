"""The command line: `tftrainer` (or `python launch.py`) --config=FILE --workdir=DIR.

Builds the strategy, locks the workdir and hands the run to `trainer/assemble.py`,
which builds what the mode needs. Any config field can be overridden, e.g.
--config.trainer.train_steps=200 --config.precision=mixed_bfloat16.
"""

import importlib.util
import os
import sys
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

import trainer
from trainer.actions.consistency_check import ReplicasDiverged
from trainer.assemble import run
from trainer.loop.signals import DiskFull, Preempted
from trainer.modes import MODES, help_text
from trainer.runtime import startup
from trainer.runtime.debug import one_replica
from trainer.runtime.distribute import build_strategy, is_chief
from trainer.state.workdir import check_readable_workdir, check_workdir
from trainer.state.workdir_lock import (EVAL_LOCK_NAME, LOCK_NAME, WorkdirLock, is_local,
                                        lock_holder)
from trainer.task import BUILT_IN

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (a get_config() module).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, summaries and config.json.")
flags.DEFINE_enum("mode", "train_and_eval", list(MODES), help_text())
flags.DEFINE_integer("local_workers", 0, "N >= 2: run N workers of this command on this "
                     "machine, a MultiWorkerMirrored cluster on localhost ports (a generated "
                     "TF_CONFIG each), their logs prefixed [worker i]; exits with the worst "
                     "status. Each worker's gRPC server listens on every network interface, "
                     "unauthenticated, and runs any graph it is sent: use it on a machine "
                     "whose firewall keeps those ports private (README, 'Security').")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.local_workers:
        from trainer.runtime import local_workers
        sys.exit(local_workers.run(FLAGS.local_workers, sys.argv))
    # Modules next to the config file (a Task, actions) import by their bare name, after
    # every other place: a file there (in a shared folder, anyone's) never shadows an
    # installed or standard module.
    config_dir = os.path.dirname(os.path.abspath(config_flags.get_config_filename(
        FLAGS["config"])))
    if config_dir not in sys.path:
        sys.path.append(config_dir)
    try:
        execute(FLAGS.config, os.path.expanduser(FLAGS.workdir), FLAGS.mode)
    except Preempted as e:  # on every worker alike: the same message and exit status
        logging.warning("%s", e)
        logging.flush()
        sys.exit(128 + e.signum)
    except DiskFull as e:  # what to do, not a traceback through TensorFlow's writers
        logging.error("%s", e)
        logging.flush()
        sys.exit(DiskFull.EXIT_STATUS)
    except ReplicasDiverged as e:  # which variables and what to do; no traceback helps
        logging.error("%s", e)
        logging.flush()
        sys.exit(1)
    except TOLD as e:
        if not raised_here(e):  # inside a library or user code: its traceback helps
            raise
        logging.debug("%s", "".join(traceback.format_exception(e)))  # (--verbosity=1)
        logging.error("%s", e)  # a message to the user (a config error): what to change
        logging.flush()
        sys.exit(1)


# What this package raises to tell the user what to change, said without a traceback. A
# bug's errors (KeyError, TypeError, AttributeError...) keep theirs.
TOLD = (ValueError, OSError, RuntimeError, ImportError, NotImplementedError,
        FloatingPointError)
_OWN = tuple(os.path.abspath(folder) + os.sep for folder in (
    *trainer.__path__, *importlib.util.find_spec(BUILT_IN).submodule_search_locations))


def raised_here(error):
    """Whether `error` was raised by this package's own code, not inside a library."""
    frame = error.__traceback__
    while frame.tb_next:
        frame = frame.tb_next
    return os.path.abspath(frame.tb_frame.f_code.co_filename).startswith(_OWN)


def execute(config, workdir, name):
    """Runs mode `name` on `workdir` (any filesystem tf.io.gfile knows: a path, gs://, ram://)."""
    import keras  # after flag parsing: keeps --help fast
    startup.mark("imports")
    mode = MODES[name]
    if mode.reads_run(config) if callable(mode.reads_run) else mode.reads_run:
        check_readable_workdir(workdir, name)
    if config.trainer.debug == "eager":
        one_replica(config.distribution)
    strategy = build_strategy(config.distribution)  # first: multi-worker needs a fresh runtime
    startup.mark("strategy")
    keras.utils.set_random_seed(config.seed)
    if mode.lock is None or not is_chief(strategy):  # only the chief writes the run's files
        run(config, strategy, workdir, name)
        return
    check_workdir(workdir)
    if mode.keeps_best:
        _refuse_two_evaluators(workdir, mode)
    with WorkdirLock(workdir, mode.lock, name):
        run(config, strategy, workdir, name)


def _refuse_two_evaluators(workdir, mode):
    """Two evaluating processes (one holds each lock) would both write eval/ and best/."""
    other = EVAL_LOCK_NAME if mode.lock == LOCK_NAME else LOCK_NAME
    owner = lock_holder(workdir, other)
    if owner and owner.get("mode") in MODES and MODES[owner["mode"]].evaluates:
        raise RuntimeError(
            f"--mode={mode.name}: pid {owner.get('pid')} on {owner.get('host')} already "
            f"evaluates {workdir} (--mode={owner.get('mode')}); two evaluators would both "
            "write eval/ and best/. Train with --mode=train next to a --mode=continuous_eval "
            "process, or use --mode=train_and_eval alone."
            + ("" if is_local(workdir) else " (On this store a lock is a lease, whose "
               f"holder this check cannot see alive: if that process is gone, delete "
               f"{os.path.join(workdir, other)}.)"))


def entry():
    """The `tftrainer` console command."""
    app.run(main)
