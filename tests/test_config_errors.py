"""Config values that are accepted but do harm are refused, each in one line that names the
field and the fix, without a traceback."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from trainer.task import get_task
from support import build, image_data, tiny_config
from support.image_data import files_config
from support.lm import tiny_lm
from trainer import assemble
from trainer.modes import continuous_eval as evaluator
from trainer.runtime.distribute import build_strategy
from trainer.state.workdir import check_outside_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("field, value, message", [
    ("optimizer.clip_norm", -1.0, r"optimizer.clip_norm=-1.0 must be a number >= 0 \(0: no "
                                  r"clipping\); set --config.optimizer.clip_norm"),
    ("optimizer.learning_rate", -0.1, r"optimizer.learning_rate=-0.1 must be a number >= 0"),
    ("trainer.max_nonfinite_steps", -1, r"trainer.max_nonfinite_steps=-1 must be an integer "
                                        r">= 0"),
])
def test_a_harmful_value_is_refused_naming_the_field(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        build(tiny_config(**{field: value}), tmp_path)


def test_no_bound_on_a_silent_worker_is_refused():
    config = tiny_config(**{"distribution.collective_timeout_seconds": 0})
    with pytest.raises(ValueError, match=r"distribution.collective_timeout_seconds=0 must be "
                                         r"a number > 0 .*hang the job forever"):
        build_strategy(config.distribution)


def test_a_continuous_evaluator_that_would_quit_at_once_is_refused(tmp_path):
    trainer = build(tiny_config(**{"eval.timeout_seconds": 0}), tmp_path)
    with pytest.raises(ValueError, match=r"eval.timeout_seconds=0 must be a number > 0"):
        evaluator.check(trainer)


def test_a_workdir_inside_the_data_is_refused(tmp_path):
    lm = tiny_lm(tmp_path, **{"data.train": str(tmp_path / "corpus" / "**")})
    with pytest.raises(ValueError, match=r"--workdir=.*corpus/run is inside the data .*read as "
                                         r"data.*outside it"):
        assemble.run(lm, tf.distribute.get_strategy(), str(tmp_path / "corpus" / "run"),
                     "train")
    x, y = image_data.digits(20)
    root = image_data.write_folder(tmp_path / "images", x, y)
    images = files_config(dict(format="folder", train=root, eval=root))
    with pytest.raises(ValueError, match=r"is inside the data"):
        assemble.run(images, tf.distribute.get_strategy(),
                     os.path.join(root, "digit_1", "run"), "train")
    assert not os.path.exists(os.path.join(root, "digit_1", "run"))
    # A glob that matches none of the run's files (and a workdir beside the data) is fine.
    get_task(lm)  # (the same config builds)
    check_outside_data(str(tmp_path / "corpus" / "run"),
                                [str(tmp_path / "corpus" / "*.txt")])


def launch(*args, **env):
    return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                                           **env))


@pytest.mark.e2e
def test_a_config_error_is_one_line_without_a_traceback(tmp_path):
    run = launch("--config=configs/lm.py", f"--workdir={tmp_path}/run",
                 "--config.trainer.train_steps=20", "--config.distribution.strategy=default")
    assert run.returncode == 1
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert ("optimizer.warmup_steps=200 must be in [0, trainer.train_steps=20): for a run "
            "this short, set --config.optimizer.warmup_steps=2") in run.stderr


@pytest.mark.e2e
def test_a_workdir_under_home_is_expanded(tmp_path):
    run = launch("--config=configs/cifar.py", "--workdir=~/runs/x", "--mode=eval",
                 HOME=str(tmp_path))
    assert f"--workdir={tmp_path}/runs/x does not exist" in run.stderr, run.stderr[-2000:]
    assert not os.path.exists(os.path.join(ROOT, "~"))
