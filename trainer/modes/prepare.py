"""--mode=prepare: the task's data made ready to read (a language model's token shards),
once, for many runs or on a bigger machine; training does the same first when needed.
It writes nothing in the workdir."""

from absl import logging

from trainer.task import get_task


def run(config, strategy, workdir, summary):
    prepared = get_task(config).prepare_data()
    if prepared is None:
        logging.info("Task %r has nothing to prepare.", config.task.name)
    else:
        logging.info("Ready: %s.", prepared)
