"""The example Task in BUILD.md runs as printed, and README commands match CI."""

import os
import re
import types

import keras
import tensorflow as tf

import tasks
from trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, path)).read(), re.S)


def test_build_md_example_task_trains(tmp_path):
    task_code, config_code = python_blocks("BUILD.md")
    exec(compile(task_code, "BUILD.md:task", "exec"), types.ModuleType("sign_of_sum").__dict__)
    config_module = types.ModuleType("sign_of_sum_config")
    exec(compile(config_code, "BUILD.md:config", "exec"), config_module.__dict__)
    config = config_module.get_config()
    config.precision = "float32"
    config.distribution.strategy = "default"
    config.trainer.update(steps_per_loop=50, log_every=50)
    keras.utils.set_random_seed(config.seed)
    task = tasks.get_task(config)
    assert type(task).__name__ == "SignOfSumTask"
    results = Trainer(config, task, tf.distribute.get_strategy(), str(tmp_path)).train()
    assert results["accuracy"] > 0.85
    assert results["num_examples"] == 1024


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```\n(.*?)```", readme, re.S)
    test_command = next(b.strip() for b in blocks if "pytest" in b)
    assert test_command in open(os.path.join(ROOT, ".ci", "run")).read()
