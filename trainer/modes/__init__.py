"""The modes of a launch, one record each: what `--mode=NAME` does, what it needs, what it
writes. trainer/cli.py builds --mode's help and takes the workdir lock from these
records; trainer/assemble.py runs them. A mode of your own: docs/add_a_mode.md."""

import dataclasses
import functools
from collections.abc import Callable

from trainer.modes import (continuous_eval, eval as eval_mode, export, find_batch_size,
                           find_lr, precision_check, prepare, sample, train)
from trainer.state.workdir_lock import EVAL_LOCK_NAME, LOCK_NAME


@dataclasses.dataclass(frozen=True)
class Mode:
    """run(config, strategy, workdir, summary) does the work.

    reads_run: it reads a trained workdir, which must exist before anything is created
        there (a function of the config, or a bool).
    lock: the workdir lock the chief holds meanwhile; None: it takes none (it only reads
        the run, or writes a directory of its own beside a running training).
    evaluates: it writes eval/ summaries.
    keeps_best: it also keeps best/: it refuses to start beside another process that
        evaluates the workdir (the other lock's holder), as two would both write them.
    summary: it writes summary_<mode>.json (training writes summary.json itself).
    trains: it trains, so the workdir must lie outside the data, and data.service applies.
    """
    name: str
    help: str
    run: Callable
    reads_run: bool | Callable = False
    lock: str | None = LOCK_NAME
    evaluates: bool = False
    keeps_best: bool = False
    summary: bool = False
    trains: bool = False


MODES = {m.name: m for m in (
    Mode("train", "train only", functools.partial(train.run, evaluate=False), trains=True),
    Mode("eval", "evaluate the latest checkpoint", eval_mode.run, reads_run=True,
         evaluates=True, summary=True),
    Mode("train_and_eval", "train, evaluating every trainer.eval_every steps",
         functools.partial(train.run, evaluate=True), evaluates=True, keeps_best=True,
         trains=True),
    Mode("continuous_eval", "evaluate each new checkpoint a --mode=train run writes",
         continuous_eval.run, lock=EVAL_LOCK_NAME, evaluates=True, keeps_best=True,
         summary=True),
    Mode("sample", "print text from the latest checkpoint (language models)", sample.run,
         reads_run=True, lock=None),
    Mode("precision_check", "the mixed policy against float32, layer by layer, for "
         "numerics.check_steps steps", precision_check.run),
    Mode("export", "a SavedModel for serving of the best or latest checkpoint (or "
         "export.checkpoint) in workdir/export/", export.run,
         reads_run=lambda config: not config.export.checkpoint, lock=None, summary=True),
    Mode("find_lr", "the learning-rate range test, which prints the rate to use",
         find_lr.run),
    Mode("find_batch_size", "the largest global batch whose step runs", find_batch_size.run),
    Mode("prepare", "make the data ready to read, once for many runs (a language "
         "model's token shards: docs/data.md#token-shards)", prepare.run, lock=None),
)}


def help_text():
    """--mode's help: each mode and what it does."""
    return "; ".join(f"{m.name}: {m.help}" for m in MODES.values()) + "."
