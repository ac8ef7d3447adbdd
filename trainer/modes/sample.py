"""--mode=sample: the text a language model generates from the latest checkpoint, to
stdout. Tokenizing and sampling are the task's (`Task.generate`)."""

import sys

from trainer.modes.eval import restore_latest
from trainer.runtime.precision import set_policy
from trainer.step.trainer import Trainer
from trainer.task import Task, get_task


def run(config, strategy, workdir, summary):
    set_policy(config.precision, strategy)
    task = get_task(config)
    if type(task).generate is Task.generate:
        raise ValueError(f"--mode=sample: task {config.task.name!r} does not generate text "
                         "(it defines no Task.generate).")
    trainer = Trainer(config, task, strategy, workdir)
    restore_latest(trainer, "sample")
    with trainer.eval_weights():  # the EMA weights, if evaluation uses them
        text = task.generate(trainer.model)
    sys.stdout.buffer.write((text + "\n").encode("utf-8"))  # whatever stdout's encoding
    sys.stdout.flush()
