"""The host loop's actions: user actions, best checkpoint, early stop, time budget,
continuous evaluation next to a training run."""

import json
import re
import os
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from support import ROOT, build, checkpoint_steps, scalars, tiny_config
from trainer import cli
from trainer.modes.train import controller as Controller
from trainer.loop.action import Action
from trainer.actions import jit_choice
from trainer.state.workdir_lock import EVAL_LOCK_NAME, LOCK_NAME, WorkdirLock


class Record(Action):
    """Remembers the steps it ran at and the logs it saw."""

    def __init__(self, every, at_end=True):
        self.every, self.at_end, self.calls = every, at_end, []

    def __call__(self, controller, step, logs):
        self.calls.append((step, dict(logs)))


def record_step(controller, step, logs, calls):
    """A plain function action from the config; `calls` is a keyword argument there."""
    calls.append(step)


def test_actions_run_at_their_steps_with_the_logs_before_them(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 10, "trainer.steps_per_loop": 5,
                            "trainer.log_every": 5, "trainer.eval_every": 6})
    calls = []
    config.actions.from_config = dict(action="test_controller.record_step", every=4,
                                      calls=calls)
    record = Record(every=3)
    build(config, tmp_path).train(actions=[record])
    assert [s for s, _ in record.calls] == [3, 6, 9, 10]  # 10: the end of training
    logs = dict(record.calls)
    assert "train/loss" not in logs[3] and "eval/accuracy" not in logs[3]
    assert "eval/accuracy" in logs[6] and "train/loss" not in logs[6]
    assert {"train/loss", "train/examples_per_sec", "eval/accuracy"} <= set(logs[10])
    assert calls == [4, 8, 10]


def test_actions_in_the_config_are_checked_before_training(tmp_path):
    config = tiny_config()
    config.actions.typo = dict(action="test_controller.no_such_action", every=2)
    with pytest.raises(ImportError, match=r"config.actions.typo.action=.*no attribute "
                                          r"'no_such_action'"):
        build(config, tmp_path).train()
    config.actions.typo = dict(every=2)
    with pytest.raises(ValueError, match="config.actions.typo needs an `action`"):
        build(config, tmp_path).train()
    assert not os.listdir(tmp_path)


def best_record(workdir):
    return json.load(open(os.path.join(workdir, "best", "best.json")))


def test_best_checkpoint_survives_rotation_and_restarts(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 10, "trainer.eval_every": 2,
                            "trainer.checkpoint_every": 2, "trainer.max_to_keep": 1,
                            "trainer.steps_per_loop": 2, "optimizer.learning_rate": 3e-3})
    record = Record(every=2)
    build(config, tmp_path).train(actions=[record])
    accuracy = [(logs["eval/accuracy"], -step) for step, logs in record.calls]
    best_value, best_step = max(accuracy)
    best = best_record(tmp_path)
    assert (best["value"], best["step"]) == (best_value, -best_step)  # the first of equals
    assert sorted(os.listdir(tmp_path / "best")) == [
        "best.json", f"{best['checkpoint']}.data-00000-of-00001", f"{best['checkpoint']}.index"]

    # A restarted run with frozen weights evaluates no better: the best stays the first
    # run's (a run that forgot it would take its own first eval, at step 12).
    config.trainer.train_steps = 14
    config.optimizer.learning_rate = 0.0
    build(config, tmp_path).train()
    after = best_record(tmp_path)
    assert (after["value"], after["step"]) == (best["value"], best["step"])
    assert after["evals_since_best"] == best["evals_since_best"] + 2  # steps 12 and 14
    assert checkpoint_steps(tmp_path / "checkpoints") == [14]  # rotation kept one, ...
    assert os.path.exists(tmp_path / "best" / f"{best['checkpoint']}.index")  # ... not best

    restored = build(tiny_config(), tmp_path / "elsewhere")
    restored.restore(str(tmp_path / "best" / best["checkpoint"]))
    assert int(restored.step.numpy()) == best["step"]
    assert restored.evaluate()["accuracy"] == best["value"]


def test_a_kill_during_the_best_write_keeps_the_previous_best(tmp_path, monkeypatch):
    def config(steps):  # the checkpoint of each step is saved before its evaluation
        return tiny_config(**{"trainer.train_steps": steps, "trainer.eval_every": 2,
                              "trainer.checkpoint_every": 2, "trainer.steps_per_loop": 2,
                              "trainer.best_metric": "eval/loss", "trainer.best_mode": "min"})

    build(config(4), tmp_path).train()
    before = best_record(tmp_path)
    trainer = build(config(8), tmp_path)

    def killed_mid_write(prefix):  # what tf.train.Checkpoint.write leaves when killed
        tf.io.gfile.makedirs(prefix + "_temp")
        tf.io.gfile.GFile(prefix + "_temp/part-00000-of-00001.index", "w").write("partial")
        raise KeyboardInterrupt("killed while writing the best checkpoint")

    monkeypatch.setattr(trainer.checkpoints, "write", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert best_record(tmp_path) == before  # the JSON still names the complete checkpoint
    reader = tf.train.load_checkpoint(str(tmp_path / "best" / before["checkpoint"]))
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == before["step"]

    # Relaunched from the checkpoint of the killed step, so the next best is of a later
    # step: the run goes on and clears the leftovers of the killed write.
    build(config(8), tmp_path).train()
    after = best_record(tmp_path)
    assert after["step"] > before["step"] and after["value"] < before["value"]
    assert sorted(os.listdir(tmp_path / "best")) == [
        "best.json", f"{after['checkpoint']}.data-00000-of-00001", f"{after['checkpoint']}.index"]


def test_a_best_of_another_metric_is_not_overwritten(tmp_path):
    build(tiny_config(**{"trainer.train_steps": 2}), tmp_path).train()
    config = tiny_config(**{"trainer.train_steps": 4, "trainer.best_metric": "eval/loss",
                            "trainer.best_mode": "min"})
    with pytest.raises(ValueError, match=r"keeps the best by eval/accuracy \(max\).*"
                                         r"best_metric=eval/accuracy"):
        build(config, tmp_path).train()
    assert best_record(tmp_path)["metric"] == "eval/accuracy"


def test_early_stop_after_patience_evals_without_improvement(tmp_path, caplog):
    caplog.set_level("INFO")
    config = tiny_config(**{"trainer.train_steps": 40, "trainer.eval_every": 2,
                            "trainer.steps_per_loop": 2, "trainer.checkpoint_every": 0,
                            "trainer.early_stop_patience": 2,
                            "optimizer.learning_rate": 0.0})  # no eval can improve
    trainer = build(config, tmp_path)
    trainer.train()
    assert int(trainer.step.numpy()) == 6  # best at 2; no better at 4 and 6
    assert checkpoint_steps(tmp_path / "checkpoints") == [6]  # the final checkpoint
    done = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Done:"))
    assert "early stop: eval/accuracy did not improve for 2 evaluations" in done

    again = build(config, tmp_path)  # relaunched: stays stopped
    again.train()
    assert int(again.step.numpy()) == 6


def test_time_budget_stops_with_a_checkpoint_and_a_relaunch_finishes(tmp_path, caplog):
    caplog.set_level("INFO")
    config = tiny_config(**{"trainer.train_steps": 20, "trainer.steps_per_loop": 5,
                            "trainer.checkpoint_every": 0, "trainer.max_seconds": 1e-6})
    trainer = build(config, tmp_path)
    trainer.train()
    assert int(trainer.step.numpy()) == 5
    assert checkpoint_steps(tmp_path / "checkpoints") == [5]
    assert any("time budget: trainer.max_seconds=1e-06 would be exceeded" in r.getMessage()
               for r in caplog.records)
    assert sorted(s for s, _ in scalars(tmp_path, "eval").get("loss", [])) == []  # stopped to resume: no eval

    config.trainer.max_seconds = 0.0
    build(config, tmp_path).train()
    assert checkpoint_steps(tmp_path / "checkpoints") == [5, 20]


def test_the_time_budget_counts_from_the_launchs_start(tmp_path, monkeypatch):
    """A scheduler's limit counts from process start: imports, strategy and model
    building (here 100 s before the loop) use the budget too."""
    from trainer.loop import controller as controller_lib
    monkeypatch.setattr(controller_lib, "launch_start", lambda created: time.time() - 100)
    config = tiny_config(**{"trainer.train_steps": 20, "trainer.steps_per_loop": 5,
                            "trainer.checkpoint_every": 0, "trainer.max_seconds": 90.0})
    build(config, tmp_path).train(evaluate=False)
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["steps"] == 5
    assert re.match(r"time budget: trainer.max_seconds=90.0 would be exceeded by another "
                    r"chunk after 10\d s", summary["stopped"])


@pytest.mark.parametrize("field,value,match", [
    ("early_stop_patience", 3, "needs trainer.best_metric"),
    ("best_mode", "maximum", "must be 'max' or 'min'"),
    ("max_seconds", -1.0, r"max_seconds=-1.0 must be a number >= 0"),
])
def test_bad_stop_settings_are_clear_errors(tmp_path, field, value, match):
    overrides = {f"trainer.{field}": value}
    if field == "early_stop_patience":
        overrides["trainer.best_metric"] = ""
    with pytest.raises(ValueError, match=match):
        build(tiny_config(**overrides), tmp_path)


def test_an_unknown_best_metric_lists_the_eval_metrics(tmp_path):
    config = tiny_config(**{"trainer.best_metric": "eval/acc"})
    with pytest.raises(ValueError, match=r"'eval/acc' is not an eval metric.*eval/accuracy"):
        build(config, tmp_path).train()


@pytest.mark.e2e
def test_continuous_eval_next_to_training_evaluates_every_checkpoint_once(tmp_path):
    common = [f"--workdir={tmp_path}", "--config=configs/cifar.py",
              "--config.data.source=synthetic", "--config.data.synthetic_train_size=256",
              "--config.data.synthetic_test_size=64", "--config.data.global_batch_size=32",
              "--config.distribution.strategy=default", "--config.precision=float32",
              "--config.trainer.train_steps=16", "--config.trainer.steps_per_loop=4",
              "--config.trainer.log_every=4", "--config.trainer.checkpoint_every=4",
              "--config.trainer.max_to_keep=10"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    evaluator = subprocess.Popen([sys.executable, "launch.py", "--mode=continuous_eval",
                                  *common, "--config.eval.timeout_seconds=120"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    training = subprocess.run([sys.executable, "launch.py", "--mode=train", *common], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
    assert training.returncode == 0, training.stderr[-3000:]
    _, eval_log = evaluator.communicate(timeout=240)  # exits by itself
    assert evaluator.returncode == 0, eval_log[-3000:]
    assert "Evaluated the final checkpoint (step 16): done." in eval_log
    summary = json.load(open(tmp_path / "summary_continuous_eval.json"))
    assert summary["evaluated_steps"] == [4, 8, 12, 16] and summary["stopped"] is None
    assert summary["ended"] == "evaluated the final checkpoint" and "accuracy" in summary["eval"]
    assert checkpoint_steps(tmp_path / "checkpoints") == [4, 8, 12, 16]
    assert sorted(s for s, _ in scalars(tmp_path, "eval").get("accuracy", [])) == [4, 8, 12, 16]  # each exactly once
    assert "eval @ step" not in training.stderr  # the training run spent nothing on eval
    assert best_record(tmp_path)["step"] in (4, 8, 12, 16)
    assert not os.path.exists(tmp_path / ".eval_lock")

    # Relaunched, it knows the final checkpoint is done and exits at once (not after the
    # default timeout of an hour).
    again = subprocess.run([sys.executable, "launch.py", "--mode=continuous_eval", *common],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(step 16) was evaluated already" in again.stderr
    summary = json.load(open(tmp_path / "summary_continuous_eval.json"))  # the relaunch's
    assert summary["ended"] == "the final checkpoint was evaluated already"
    assert summary["evaluated_steps"] == [] and summary["last_evaluated_step"] == 16
    assert "eval @ step" not in again.stderr
    assert sorted(s for s, _ in scalars(tmp_path, "eval").get("accuracy", [])) == [4, 8, 12, 16]


def test_continuous_eval_refuses_a_run_that_evaluates_itself(tmp_path):
    config = tiny_config()
    with WorkdirLock(str(tmp_path), LOCK_NAME, "train_and_eval"):
        with pytest.raises(RuntimeError, match="two evaluators would both write eval/"):
            cli.execute(config, str(tmp_path), "continuous_eval")
    config = tiny_config(**{"trainer.train_steps": 4, "trainer.checkpoint_every": 4})
    build(config, tmp_path).train(evaluate=False)
    with WorkdirLock(str(tmp_path), LOCK_NAME, "train"):  # a --mode=train run is fine:
        cli.execute(config, str(tmp_path), "continuous_eval")  # evaluates its checkpoint
    assert [step for step, _ in scalars(tmp_path, "eval")["accuracy"]] == [4]


def test_only_the_modes_that_keep_best_refuse_a_second_evaluator(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 4, "trainer.checkpoint_every": 4})
    build(config, tmp_path).train(evaluate=False)
    with WorkdirLock(str(tmp_path), EVAL_LOCK_NAME, "continuous_eval"):
        with pytest.raises(RuntimeError, match="two evaluators would both write eval/"):
            cli.execute(config, str(tmp_path), "train_and_eval")
        cli.execute(config, str(tmp_path), "eval")  # writes eval/ once, keeps no best/
    assert json.load(open(tmp_path / "summary_eval.json"))["step"] == 4


def test_a_relaunch_after_a_crash_does_not_count_evaluations_twice(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 8, "trainer.eval_every": 2,
                            "trainer.steps_per_loop": 2, "trainer.checkpoint_every": 4,
                            "trainer.early_stop_patience": 10,
                            "optimizer.learning_rate": 0.0})  # no eval can improve
    build(config, tmp_path).train()
    assert best_record(tmp_path)["evals_since_best"] == 3  # best at 2; not beaten at 4-8
    # A crash after the evaluation at step 8, before its checkpoint: the newest is ckpt-4.
    directory = str(tmp_path / "checkpoints")
    for path in tf.io.gfile.glob(os.path.join(directory, "ckpt-8*")):
        tf.io.gfile.remove(path)
    tf.compat.v1.train.update_checkpoint_state(directory, os.path.join(directory, "ckpt-4"))
    config.trainer.train_steps = 10
    build(config, tmp_path).train()  # evaluates steps 6 and 8 again, then 10
    assert best_record(tmp_path)["evals_since_best"] == 4  # 4, 6, 8 and 10, each once


def test_a_run_that_raises_inside_the_profile_window_stops_the_profiler(tmp_path):
    class Boom(Action):
        every = 3

        def __call__(self, controller, step, logs):
            raise RuntimeError("boom")

    config = tiny_config(**{"trainer.train_steps": 10, "trainer.steps_per_loop": 1,
                            "trainer.profile_steps": (2, 8)})
    with pytest.raises(RuntimeError, match="boom"):
        build(config, tmp_path).train(evaluate=False, actions=[Boom()])
    tf.profiler.experimental.start(str(tmp_path / "again"))  # raises if one still runs
    tf.profiler.experimental.stop()


def test_the_export_at_the_end_of_a_train_run_takes_the_best_the_workdir_keeps(tmp_path):
    """A --mode=train run next to a continuous evaluator: the evaluator keeps best/."""
    config = tiny_config(**{"trainer.train_steps": 2, "trainer.eval_every": 2,
                            "trainer.checkpoint_every": 2})
    build(config, tmp_path).train()  # best/ckpt-2, as an evaluator would keep it
    assert best_record(tmp_path)["checkpoint"] == "ckpt-2"
    config = tiny_config(**{"trainer.train_steps": 4, "trainer.checkpoint_every": 2,
                            "export.enabled": True})
    build(config, tmp_path).train(evaluate=False)
    assert sorted(os.listdir(tmp_path / "export")) == ["2"]


class _Clock:
    """Real time plus what the test's actions say they took."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self):
        return time.monotonic() + self.offset


class _Slow(Action):
    def __init__(self, clock, every, seconds):
        self.clock, self.every, self.seconds = clock, every, seconds

    def __call__(self, controller, step, logs):
        self.clock.offset += self.seconds


def test_time_budget_counts_the_actions_due_after_the_next_chunk(tmp_path):
    # Two 100 s actions, each seen alone (steps 20, 30, 40), are both due at step 60.
    # Before the chunk to 60, 300 s are gone: 60 would end past the 450 s budget.
    config = tiny_config(**{"trainer.train_steps": 60, "trainer.steps_per_loop": 10, "trainer.log_every": 10,
                            "trainer.checkpoint_every": 0, "trainer.max_seconds": 450.0})
    trainer = build(config, tmp_path)
    clock = _Clock()
    controller = Controller(trainer, evaluate=False,
                            actions=[_Slow(clock, 20, 100.0), _Slow(clock, 30, 100.0)])
    controller.clock = clock
    controller.train()
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["steps"] == 50 and summary["stopped"].startswith("time budget")
    assert summary["seconds"]["total"] <= 450.0
    assert checkpoint_steps(tmp_path / "checkpoints") == [50]


def test_every_input_pipeline_of_a_run_runs_without_the_autotune_thread(tmp_path,
                                                                          monkeypatch):
    """tf.data's autotuning model thread made a finished run wait 6-17 s to exit (its
    iterator's destructor waits for the thread's next optimization period)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the pass is timed
    monkeypatch.setattr(jit_choice, "LONG_RUN_SECONDS", 0.0)
    trainer = build(tiny_config(**{"trainer.jit_compile": "auto",
                                   "trainer.train_steps": 10}), tmp_path)
    built = []
    distribute = trainer.strategy.distribute_datasets_from_function
    monkeypatch.setattr(trainer.strategy, "distribute_datasets_from_function",
                        lambda fn, options=None: distribute(
                            lambda ctx: built.append(fn(ctx)) or built[-1], options))
    trainer.train()
    assert len(built) == 4  # train, the jit choice's batch (timed both ways), eval
    assert [ds.options().autotune.enabled for ds in built] == [False] * 4
