"""The divergence diagnosis: a run that stops for divergence replays its steps from the
last good state and names the layer, pass, dtype and op that went non-finite, on
models made to fail in a known place (tests/support/made_to_fail.py)."""

import hashlib
import json
import os
import shlex
import sys

import keras
import pytest
import tensorflow as tf
from absl import flags
from ml_collections import config_flags

from support import ROOT, checkpoint_steps, two_replicas
from support.made_to_fail import FAILING_STEP, MadeToFail, made_to_fail_config
from trainer import Trainer
from trainer.loop.action import Action
from trainer.loop.diagnosis_report import resume_command
from trainer.runtime.precision import set_policy

EXPECTED = {  # case: (layer, pass, compute dtype, op check_numerics names)
    "overflow_dense": ("made_to_fail/overflow", "forward", "float16", "MatMul"),
    "log_of_zero": ("made_to_fail/safe_log", "backward", "float32", "Log"),
    "large_logits": ("attention", "forward", "float16", "Einsum"),
}
FLOAT32_STEPS_STOP = {"log_of_zero", "nan_input"}  # one non-finite step stops them


class CheckpointFiles(Action):
    """The checkpoint files' contents when the training loop ends (before a diagnosis)."""

    def __init__(self):
        self.files = None

    def __call__(self, controller, step, logs):
        pass

    def end(self, controller):
        self.files = checkpoint_files(controller.trainer.workdir)


def checkpoint_files(workdir):
    directory = os.path.join(workdir, "checkpoints")
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    return {name: hashlib.sha256(open(os.path.join(directory, name), "rb").read()).hexdigest()
            for name in names}


def run(case, workdir, strategy=None, **overrides):
    """Trains the made-to-fail `case`; returns (the error, diagnosis.json or None, the
    checkpoint files as the loop left them)."""
    if case in FLOAT32_STEPS_STOP:  # the steps after the failing one are finite
        overrides.setdefault("trainer.max_nonfinite_steps", 1)
    config = made_to_fail_config(case, **overrides)
    strategy = strategy or tf.distribute.get_strategy()
    set_policy(config.precision, strategy)
    keras.utils.set_random_seed(config.seed)
    trainer = Trainer(config, MadeToFail(config, case), strategy, str(workdir))
    files = CheckpointFiles()
    with pytest.raises(FloatingPointError) as error:
        trainer.train(evaluate=False, actions=[files])
    path = os.path.join(workdir, "diagnosis.json")
    diagnosis = json.load(open(path)) if os.path.exists(path) else None
    return error.value, diagnosis, files.files


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_the_report_names_the_layer_that_was_made_to_fail(case, tmp_path):
    error, diagnosis, files = run(case, tmp_path)
    layer, where, dtype, op = EXPECTED[case]
    assert diagnosis["outcome"] == "nonfinite"
    assert (diagnosis["layer"], diagnosis["pass"], diagnosis["compute_dtype"]) == (
        layer, where, dtype)
    assert f"step {FAILING_STEP}:" in diagnosis["why"]
    assert diagnosis["op"]["op"] == op
    assert diagnosis["replayed_from_state"].endswith("ckpt-4")
    assert diagnosis["steps_replayed_before"] == FAILING_STEP - 4 - 1
    # The last log line (the error's message) and summary.json say it too.
    message = str(error)
    assert f"'{layer}'" in message and diagnosis["resume_command"] in message
    assert "Try a lower" not in message  # the generic remedies gave way to the diagnosis
    stopped = json.load(open(tmp_path / "summary.json"))["stopped"]
    assert stopped.startswith("Diverged: Training diverged") and f"'{layer}'" in stopped
    # The checkpoints were only read.
    assert checkpoint_files(tmp_path) == files and checkpoint_steps(
        tmp_path / "checkpoints") == [4]
    if dtype == "float16":  # the fix: that layer in float32
        assert diagnosis["fix_flags"] == [
            f'--config.precision_overrides.float32_layers=["{layer}"]']
        assert 40000 < diagnosis["largest_before"] < 65504 or case == "large_logits"
    else:  # no precision fixes a NaN of the math: the op and the line are named
        assert diagnosis["fix_flags"] == []
        assert "made_to_fail.py line" in diagnosis["op"]["created_at"]


@pytest.mark.parametrize("case, overrides, layer, where, fix_flags", [
    # the layer inside a nested Functional backbone, not the backbone
    ("nested_overflow", {}, "made_to_fail/overflow", "forward",
     ['--config.precision_overrides.float32_layers=["made_to_fail/overflow"]']),
    # micro-batches inspected one at a time: the same layer
    ("overflow_dense", {"trainer.accumulation_steps": 2, "data.global_batch_size": 2},
     "made_to_fail/overflow", "forward",
     ['--config.precision_overrides.float32_layers=["made_to_fail/overflow"]']),
    # a NaN of the math, under float16: float32 does not fix it, and it says so
    ("log_of_zero", {"precision": "mixed_float16"}, "made_to_fail/safe_log", "backward", []),
    # bad data is the data's fault, not a layer's
    ("nan_input", {}, None, "input", []),
])
def test_the_report_on_other_shapes_of_failure(case, overrides, layer, where, fix_flags,
                                               tmp_path):
    _, diagnosis, _ = run(case, tmp_path, **overrides)
    assert (diagnosis["layer"], diagnosis["pass"], diagnosis["fix_flags"]) == (
        layer, where, fix_flags), diagnosis["why"]
    if case == "log_of_zero":
        assert "in float32 it is not finite either" in diagnosis["fix"]
    if case == "nan_input":
        assert f"step {FAILING_STEP}: its batch holds inf or NaN (16 entries in the " \
               "features" in diagnosis["why"]


def test_the_fix_it_gives_resumes_past_the_step(tmp_path):
    _, diagnosis, _ = run("overflow_dense", tmp_path)
    assert diagnosis["largest_before"] == 16 * 600 * (FAILING_STEP - 1)  # float16-exact
    layers = json.loads(diagnosis["fix_flags"][0].split("=", 1)[1])
    config = made_to_fail_config("overflow_dense",
                                 **{"precision_overrides.float32_layers": tuple(layers)})
    set_policy(config.precision, tf.distribute.get_strategy())
    trainer = Trainer(config, MadeToFail(config, "overflow_dense"),
                      tf.distribute.get_strategy(), str(tmp_path))
    trainer.train(evaluate=False)
    assert int(trainer.step.numpy()) == config.trainer.train_steps
    assert json.load(open(tmp_path / "summary.json"))["stopped"] is None


def test_two_replicas_name_the_same_layer(tmp_path):
    _, diagnosis, _ = run("overflow_dense", tmp_path, strategy=two_replicas())
    assert (diagnosis["layer"], diagnosis["pass"]) == ("made_to_fail/overflow", "forward")


def test_a_run_without_a_checkpoint_replays_from_its_start(tmp_path):
    before = set(tf.io.gfile.glob("ram://tftrainer/*"))  # (other tests' Controllers')
    _, diagnosis, _ = run("log_of_zero", tmp_path, **{"trainer.checkpoint_every": 100})
    assert diagnosis["replayed_from_state"] == "the start of the run (step 0)"
    assert diagnosis["layer"] == "made_to_fail/safe_log"
    assert diagnosis["steps_replayed_before"] == FAILING_STEP - 1
    assert set(tf.io.gfile.glob("ram://tftrainer/*")) <= before  # this run's copy freed


def test_it_gives_up_at_its_time_bound_and_says_so(tmp_path):
    error, diagnosis, _ = run("overflow_dense", tmp_path,
                              **{"trainer.diagnose_max_seconds": 1e-6})
    assert diagnosis["outcome"] == "gave_up"
    assert "diagnose_max_seconds" in diagnosis["why"] and "diagnose_max_seconds" in str(error)


def test_a_replay_that_stays_finite_says_so_and_retries_deterministic(tmp_path, monkeypatch):
    retried = []
    monkeypatch.setattr(tf.config.experimental, "enable_op_determinism",
                        lambda: retried.append(True))  # (process-wide, for good)
    builds = []

    class FiniteWhenReplayed(MadeToFail):
        def build_inputs(self, split, input_context, start_step=0):
            builds.append(start_step)
            dataset = super().build_inputs(split, input_context, start_step)
            return dataset if len(builds) == 1 else dataset.map(
                lambda x, y: (tf.ones_like(x), y))  # no zero input: finite

    config = made_to_fail_config("log_of_zero", **{"trainer.max_nonfinite_steps": 1})
    set_policy(config.precision, tf.distribute.get_strategy())
    trainer = Trainer(config, FiniteWhenReplayed(config, "log_of_zero"),
                      tf.distribute.get_strategy(), str(tmp_path))
    with pytest.raises(FloatingPointError):
        trainer.train(evaluate=False)
    diagnosis = json.load(open(tmp_path / "diagnosis.json"))
    assert diagnosis["outcome"] == "finite" and retried == [True]
    assert "did not reproduce" in diagnosis["why"] and diagnosis["retried_deterministic"]


def test_diagnose_false_keeps_the_generic_remedies(tmp_path):
    error, diagnosis, _ = run("overflow_dense", tmp_path, **{"trainer.diagnose": False})
    assert diagnosis is None and "Try a lower" in str(error)


def test_the_resume_command_is_the_launch_with_the_fix_and_parses_back(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [
        "launch.py", "--config=configs/cifar.py", "--workdir=runs/x",
        '--config.precision_overrides.float32_layers=["old"]', "--config.seed=3"])
    fix = '--config.precision_overrides.float32_layers=["old", "made_to_fail/overflow"]'
    command = shlex.split(resume_command([fix]))
    assert command[:2] == ["python", "launch.py"] and command.count(
        command[-1]) == 1 and command[-1] == fix  # the old value replaced, not repeated
    parsed = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=parsed)
    flags.DEFINE_string("workdir", None, "", flag_values=parsed)
    parsed(command[1:])
    assert tuple(parsed.config.precision_overrides.float32_layers) == (
        "old", "made_to_fail/overflow")
    assert parsed.config.seed == 3 and parsed.workdir == "runs/x"
