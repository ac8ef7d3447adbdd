"""--mode=find_lr and --mode=find_batch_size."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import tasks
from conftest import scalars, tiny_config
from trainer import cli
from trainer.modes.batch_size_finder import find_batch_size
from trainer.modes.lr_finder import suggest


def test_find_lr_sweeps_until_the_loss_diverges_and_suggests_a_rate(tmp_path, capsys):
    config = tiny_config(**{"find_lr.steps": 60, "find_lr.min_lr": 1e-5,
                            "find_lr.max_lr": 100.0})  # Adam at 100 cannot train
    cli.execute(config, str(tmp_path), "find_lr")
    report = json.load(open(tmp_path / "find_lr.json"))
    rates, losses = report["learning_rates"], report["losses"]
    assert 10 < len(rates) == len(losses) < 60  # stopped early
    assert "passed 4x its minimum" in report["stopped"] or "non-finite" in report["stopped"]
    growth = (100.0 / 1e-5) ** (1 / 59)
    np.testing.assert_allclose(rates, 1e-5 * growth ** np.arange(len(rates)), rtol=1e-4)
    assert min(losses) < losses[0]  # it learned somewhere in the sweep
    assert 1e-5 < report["suggestion"] < report["lowest_loss_lr"] < 100.0
    assert f"--config.optimizer.learning_rate={report['suggestion']:.3g}" in (
        capsys.readouterr().out)
    assert os.path.getsize(tmp_path / "find_lr.png") > 1000
    assert len(scalars(tmp_path, "find_lr")["loss"]) == len(losses)
    assert not os.path.exists(tmp_path / "checkpoints")  # nothing of a run written


def test_the_suggestion_is_the_steepest_descent_before_the_minimum():
    rates = list(np.geomspace(1e-6, 1.0, 61))
    # flat, a slow fall, the steepest fall around 30, the minimum at 40, a rise
    smoothed = ([3.0] * 20 + [3.0 - 0.05 * i for i in range(1, 11)] + [2.0]
                + [1.4 - 0.01 * i for i in range(10)] + [1.5 + 0.2 * i for i in range(20)])
    assert int(np.argmin(smoothed)) == 40
    result = suggest(rates, smoothed)
    assert result["lowest_loss_lr"] == rates[40]
    assert result["suggestion"] == rates[30]  # np.gradient: (1.4 - 2.5) / 2 there
    assert suggest(rates[:4], smoothed[:4]) == {"suggestion": None, "lowest_loss_lr": None}


@pytest.mark.parametrize("field,value,match", [
    ("min_lr", 20.0, "must satisfy 0 < min_lr < max_lr"),
    ("steps", 3, "must be an integer >= 10"),
    ("diverge", 1.0, "must be > 1"),
])
def test_bad_find_lr_settings_are_clear_errors(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        cli.execute(tiny_config(**{f"find_lr.{field}": value}), str(tmp_path), "find_lr")


class _OutOfMemoryAbove:
    """A task whose step runs out of memory above `limit` examples (raised while the
    step is traced, as an allocation failure would be while it runs)."""

    def __init__(self, limit):
        self.limit = limit

    def __call__(self, config):
        import tasks
        task = tasks.get_task(config)
        build_model, limit = task.build_model, self.limit

        def build():
            model = build_model()
            call = model.call

            def call_within_memory(inputs, *args, **kwargs):
                if inputs.shape[0] and inputs.shape[0] > limit:
                    raise tf.errors.ResourceExhaustedError(
                        None, None, f"OOM when allocating a batch of {inputs.shape[0]}")
                return call(inputs, *args, **kwargs)

            model.call = call_within_memory
            return model

        task.build_model = build
        return task


def test_find_batch_size_doubles_then_bisects_to_the_largest_that_fits(tmp_path, capsys):
    config = tiny_config(**{"find_batch_size.steps_per_trial": 1})  # starts at 32
    report = find_batch_size(config, tf.distribute.get_strategy(), str(tmp_path),
                             _OutOfMemoryAbove(100))
    tried = [(t["batch"], t["runs"]) for t in report["trials"]]
    assert tried == [(32, True), (64, True), (128, False), (96, True), (112, False),
                     (104, False)]
    assert "out of memory" in report["trials"][2]["reason"]
    assert report["trials"][0]["peak_bytes"] > 0  # the allocator's peak, measured
    assert (report["largest"], report["first_failing"]) == (96, 104)
    assert "--config.data.global_batch_size=96" in capsys.readouterr().out
    assert json.load(open(tmp_path / "find_batch_size.json")) == report
    assert not os.path.exists(tmp_path / "checkpoints")


def test_find_batch_size_memory_budget_and_the_data_set_bound_it(tmp_path):
    budget = {"find_batch_size.memory_budget_gb": 1e-6, "find_batch_size.multiple_of": 16}
    with pytest.raises(RuntimeError, match=r"no batch down to 16 runs \(peak memory .* > "
                                           r"find_batch_size.memory_budget_gb=1e-06\)"):
        cli.execute(tiny_config(**budget), str(tmp_path / "a"), "find_batch_size")
    config = tiny_config(**{"data.synthetic_train_size": 100, "find_batch_size.start": 64,
                            "find_batch_size.steps_per_trial": 1})
    report = find_batch_size(config, tf.distribute.get_strategy(), str(tmp_path / "b"),
                             tasks.get_task)
    assert report["largest"] == 96 and "training examples" in report["trials"][1]["reason"]
