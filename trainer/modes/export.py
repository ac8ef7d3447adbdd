"""--mode=export: a SavedModel for serving of the checkpoint `choose_checkpoint` picks (the
best, else the latest, or export.checkpoint) in workdir/export/<step>/. Builds no Trainer:
the SavedModel is written by trainer/actions/export.py, as at the end of training."""

from trainer.actions.export import choose_checkpoint, export
from trainer.loop.run_summary import check_task_record
from trainer.runtime.distribute import is_chief
from trainer.runtime.precision import set_policy, use_float32_layers
from trainer.task import get_task


def run(config, strategy, workdir, summary):
    set_policy(config.precision, strategy)
    task = get_task(config)
    use_float32_layers(tuple(config.precision_overrides.float32_layers))
    if is_chief(strategy):  # one writer
        summary["checkpoint"] = choose_checkpoint(config, workdir)
        check_task_record(workdir, task.run_record(), summary["checkpoint"])
        summary["directory"] = export(config, task, workdir, summary["checkpoint"])
