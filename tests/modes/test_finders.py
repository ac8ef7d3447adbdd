"""--mode=find_lr and --mode=find_batch_size."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from trainer.task import get_task
from support import build, scalars, tiny_config
from trainer import cli
from trainer.modes.find_batch_size import find_batch_size
from trainer.modes.find_lr import suggest
from trainer.runtime.precision import layers_of, set_policy


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
        from trainer.task import get_task
        task = get_task(config)
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
    assert report["trials"][0]["peak_bytes"] > 0  # the trial's peak (a CPU: its RSS), measured
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
                             get_task)
    assert report["largest"] == 96 and "training examples" in report["trials"][1]["reason"]


@pytest.mark.parametrize("mode", ["find_lr", "find_batch_size"])
def test_the_finders_run_on_a_config_with_warmup(tmp_path, mode, capsys):
    """As configs/cifar_gpu.py, lm.py and vit_cifar.py ship: warmup_steps beyond the
    finder's own steps."""
    config = tiny_config(**{"optimizer.name": "sgd", "optimizer.schedule": "cosine",
                            "optimizer.warmup_steps": 200, "find_lr.steps": 10,
                            "find_batch_size.steps_per_trial": 1,
                            "find_batch_size.max_trials": 2})
    cli.execute(config, str(tmp_path), mode)
    report = json.load(open(tmp_path / f"{mode}.json"))
    if mode == "find_lr":
        assert len(report["losses"]) == 10
    else:  # every trial ran: no "None did not"
        assert [t["runs"] for t in report["trials"]] == [True, True]
        out = capsys.readouterr().out
        assert "is 64 (no failure within find_batch_size.max_trials=2" in out
        assert "None" not in out


class _PolicySpy:
    """Builds the task and records each build's global policy and layer compute dtypes."""

    def __init__(self):
        self.builds = []

    def __call__(self, config):
        task = get_task(config)
        build_model = task.build_model

        def build():
            model = build_model()
            self.builds.append({layer.path: layer.compute_dtype for layer in layers_of(model)
                                if layer.variables})
            return model

        task.build_model = build
        return task


def test_every_batch_size_trial_runs_in_the_runs_policy_and_overrides(tmp_path):
    config = tiny_config(precision="mixed_bfloat16", **{
        "precision_overrides.float32_layers": ["seed_cnn/dense_1"],
        "find_batch_size.steps_per_trial": 1, "find_batch_size.max_trials": 2})
    set_policy(config.precision, tf.distribute.get_strategy())
    spy = _PolicySpy()
    report = find_batch_size(config, tf.distribute.get_strategy(), str(tmp_path), spy)
    assert len(spy.builds) == 2
    for layers in spy.builds:
        assert layers.pop("seed_cnn/dense_1") == "float32"
        assert set(layers.values()) == {"bfloat16"}
    assert report["precision"] == "mixed_bfloat16"


def test_find_batch_size_on_a_cpu_keeps_within_half_the_available_memory(tmp_path,
                                                                         monkeypatch):
    from trainer.modes import find_batch_size as batch_size_finder
    config = tiny_config(**{"find_batch_size.steps_per_trial": 1,
                            "find_batch_size.max_trials": 1})
    report = find_batch_size(config, tf.distribute.get_strategy(), str(tmp_path / "a"),
                             get_task)
    available = batch_size_finder.available_memory_bytes()
    assert report["memory_budget_gb"] == pytest.approx(available / 2 / 2**30, rel=0.1)
    assert "half of the" in report["memory_budget"]
    # a machine with 64 KB available: the first trial's peak passes the budget
    monkeypatch.setattr(batch_size_finder, "available_memory_bytes", lambda: 2**16)
    with pytest.raises(RuntimeError, match=r"peak memory .* > find_batch_size."
                                           r"memory_budget_gb=3.05e-05"):
        find_batch_size(config, tf.distribute.get_strategy(), str(tmp_path / "b"),
                        get_task)


def test_find_lr_sweeps_the_model_training_would_start_from(tmp_path):
    trained = tiny_config(**{"trainer.train_steps": 4, "trainer.eval_every": 0,
                             "trainer.checkpoint_every": 4})
    build(trained, tmp_path / "source").train(evaluate=False)
    config = tiny_config(**{"find_lr.steps": 10, "init.checkpoint": str(tmp_path / "source")})
    cli.execute(config, str(tmp_path / "lr"), "find_lr")
    record = json.load(open(tmp_path / "lr" / "init.json"))
    assert record["loaded"] and not record["left_at_init"]
    config.init.checkpoint = str(tmp_path / "missing.weights.h5")
    with pytest.raises(Exception, match="missing.weights.h5"):
        cli.execute(config, str(tmp_path / "lr2"), "find_lr")


def test_a_trial_predicted_past_the_budget_is_not_run(tmp_path, monkeypatch):
    """On a CPU a trial could take the machine's memory before its peak is measured: one
    whose peak, scaled from the largest batch that ran, passes the budget is skipped.
    (Trials stand in: a peak of 1 MB per example, within the 48 MB budget or not.)"""
    from trainer.modes import find_batch_size as batch_size_finder
    ran = []

    def trial(config, strategy, workdir, make_task, batch, budget_gb):
        ran.append(batch)
        peak = batch * 2**20
        return {"batch": batch, "runs": peak <= budget_gb * 2**30, "peak_bytes": peak,
                "reason": None if peak <= budget_gb * 2**30 else "peak past the budget"}

    monkeypatch.setattr(batch_size_finder, "_trial", trial)
    config = tiny_config(**{"find_batch_size.memory_budget_gb": 48 / 1024,
                            "find_batch_size.max_trials": 6})
    report = find_batch_size(config, tf.distribute.get_strategy(), str(tmp_path), None)
    skipped = [t["batch"] for t in report["trials"] if t["batch"] not in ran]
    assert 64 in skipped and max(ran) <= 48  # 64 x 1 MB > 48 MB: never run
    assert all(t["reason"].startswith("not run: its peak would be about") for t in
               report["trials"] if t["batch"] in skipped)
    assert report["largest"] == 48
