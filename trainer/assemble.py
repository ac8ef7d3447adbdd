"""The one place that runs a mode: `trainer/cli.py` builds the strategy, locks the workdir
and calls `run`; the mode's record (trainer/modes/__init__.py) says what it needs, and
its module builds that and nothing else:

    precision and task -> Trainer (model, optimizer, compiled step, checkpoints)
        -> the actions, in trainer/actions/'s order -> Controller (only runs the loop)

Evaluation has no logging or export action; export builds no Trainer.
"""

import contextlib

import tensorflow as tf
from absl import logging

from trainer.loop.run_summary import mode_summary
from trainer.modes import MODES
from trainer.runtime.distribute import is_chief
from trainer.state.workdir import ChiefFiles
from trainer.task import get_task


def run(config, strategy, workdir, mode):
    """Runs `mode` (a name of MODES) with `strategy` on `workdir`; a mode with a summary
    writes `summary_<mode>.json`. An error raised while reading the input is told as the
    task explains it (the file that broke it)."""
    try:
        _run(config, strategy, workdir, MODES[mode])
    except tf.errors.OpError as error:
        explained = get_task(config).explain_input_error(error)
        if explained is None:
            raise
        raise explained from error


def _run(config, strategy, workdir, mode):
    if not mode.trains and config.data.get("service"):  # (a task's field, not base's)
        # The finders and the precision check compare runs on the same batches, which
        # the service's delivery order would not give.
        logging.info("data.service=%s is for training: --mode=%s reads its input itself.",
                     config.data.service, mode.name)
        config.data.service = ""
    summary = (mode_summary(workdir, mode.name, ChiefFiles(is_chief(strategy)))
               if mode.summary else contextlib.nullcontext({}))
    with summary as written:
        mode.run(config, strategy, workdir, written)
