"""--mode=find_lr: the learning-rate range test."""

import json
import os

import numpy as np
import pytest

from conftest import scalars, tiny_config
from trainer import cli
from trainer.lr_finder import suggest


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
