"""launch.py as a user runs it, and the clear errors it gives on bad input."""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from trainer.task import get_task
from support import scalars, tiny_config, two_replicas
from trainer import Trainer
from trainer.runtime.distribute import build_strategy, is_chief

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.data.source=synthetic", "--config.data.synthetic_train_size=256",
        "--config.data.synthetic_test_size=64", "--config.data.global_batch_size=32",
        "--config.distribution.strategy=default", "--config.trainer.steps_per_loop=4",
        "--config.trainer.log_every=4", "--config.trainer.eval_every=8",
        "--config.trainer.checkpoint_every=8"]


def launch(workdir, *args, config="configs/cifar.py"):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, "launch.py", f"--config={config}", f"--workdir={workdir}", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_cli_trains_resumes_and_evaluates(tmp_path):
    run = launch(tmp_path, *TINY, "--config.trainer.train_steps=8",
                 "--config.precision=mixed_bfloat16",
                 """--config.precision_overrides.float32_layers=[".*dense.*"]""")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "step 8/8" in run.stderr and "Precision policy mixed_bfloat16" in run.stderr
    assert re.search(r"float32 +Dense x2: seed_cnn/dense", run.stderr)  # the dtype table
    assert re.search(r"bfloat16 +Conv2D x1: seed_cnn/conv2d", run.stderr)
    assert "tensorboard --logdir" in run.stderr and "SYNTHETIC" in run.stderr
    run = launch(tmp_path, *TINY, "--config.trainer.train_steps=12")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Restored" in run.stderr and "step 12/12" in run.stderr
    assert "step 4/12" not in run.stderr and "step 8/12" not in run.stderr
    run = launch(tmp_path, *TINY, "--mode=eval")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "eval @ step 12" in run.stderr
    summary = json.load(open(tmp_path / "summary_eval.json"))  # beside the run's own
    assert (summary["mode"], summary["step"], summary["stopped"]) == ("eval", 12, None)
    assert summary["checkpoint"].endswith("ckpt-12") and "accuracy" in summary["eval"]
    assert json.load(open(tmp_path / "summary.json"))["steps_this_run"] == 4
    assert_start_phases(tmp_path)


def assert_start_phases(workdir):
    """Each launch's start, phase by phase, adds up to its time from the process's start
    to its loop; the first launch timed XLA's choice (jit_compile=auto), the second read
    it from the workdir; the FLOPs count is timed in the summary."""
    starts = [json.loads(line) for line in open(workdir / "goodput.jsonl")
              if '"start"' in line]
    assert len(starts) == 2
    for start in starts:
        phases = start["phases"]
        assert list(phases)[:3] == ["imports", "strategy", "build"] and "data" in phases
        assert phases["imports"] > 1.0  # TensorFlow and Keras, at least
        assert abs(sum(phases.values()) - (start["time"] - start["process_start"])) < 0.01
    assert "jit_choice" in starts[0]["phases"] and "jit_choice" in starts[1]["phases"]
    summary = json.load(open(workdir / "summary.json"))
    assert summary["startup_seconds"] == starts[1]["phases"]
    assert summary["flops_count_seconds"] > 0


@pytest.mark.e2e
def test_misspelt_config_key_fails_before_any_work(tmp_path):
    run = launch(tmp_path / "w", "--config.trainer.train_stpes=5")
    assert run.returncode != 0
    assert "train_stpes" in run.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.e2e
def test_eval_without_checkpoint_is_a_clear_error(tmp_path):
    run = launch(tmp_path, *TINY, "--mode=eval")
    assert run.returncode != 0
    assert "no checkpoint in" in run.stderr and "Train first" in run.stderr
    stopped = json.load(open(tmp_path / "summary_eval.json"))["stopped"]
    assert stopped.startswith("FileNotFoundError: --mode=eval: no checkpoint in")


@pytest.mark.parametrize("mode", ["eval", "export", "sample"])
def test_a_read_only_mode_on_a_mistyped_workdir_creates_nothing(tmp_path, mode):
    from trainer import cli
    with pytest.raises(FileNotFoundError, match=rf"--mode={mode}: --workdir=.*typo does not "
                                                "exist"):
        cli.execute(tiny_config(), str(tmp_path / "typo"), mode)
    assert os.listdir(tmp_path) == []


def test_unknown_task_lists_known_ones():
    with pytest.raises(ValueError, match=r"Unknown task 'cifar100'.*Known tasks: images, lm"):
        get_task(tiny_config(**{"task.name": "cifar100"}))


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match=r"model.name='vgg'.*resnet"):
        get_task(tiny_config(**{"model.name": "vgg"}))


def test_tpu_without_a_tpu_names_the_address_and_flag():
    config = tiny_config(**{"distribution.strategy": "tpu", "distribution.tpu": ""})
    with pytest.raises(RuntimeError, match=r"No TPU found at .*--config.distribution.tpu"):
        build_strategy(config.distribution)


def test_batch_not_divisible_by_replicas(tmp_path):
    config = tiny_config(**{"data.global_batch_size": 33})
    with pytest.raises(ValueError, match="multiple of the 2 replicas"):
        Trainer(config, get_task(config), two_replicas(), str(tmp_path))
    assert not os.listdir(tmp_path)


def test_resnet_builds_and_steps(tmp_path):
    config = tiny_config(**{"model.name": "resnet", "model.blocks_per_stage": 1,
                            "optimizer.name": "sgd", "optimizer.schedule": "cosine",
                            "optimizer.warmup_steps": 2, "trainer.train_steps": 4,
                            "trainer.steps_per_loop": 2})
    trainer = Trainer(config, get_task(config), tf.distribute.get_strategy(),
                      str(tmp_path))
    assert trainer.model.losses  # L2 weight decay flows into the loss
    trainer.train(evaluate=False)
    assert int(trainer.optimizer.iterations.numpy()) == 4


@pytest.mark.e2e
def test_legacy_keras_env_fails_fast(tmp_path):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run([sys.executable, "launch.py", "--config=configs/cifar.py",
                          f"--workdir={tmp_path / 'w'}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "Unset TF_USE_LEGACY_KERAS" in run.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("config_arg,expected", [
    ("configs/nope.py", "nope.py"),
    ("trainer/task.py", "get_config"),
])
def test_bad_config_file_is_a_clear_error(tmp_path, config_arg, expected):
    run = launch(tmp_path / "w", config=config_arg)
    assert run.returncode != 0
    assert expected in run.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "w").exists()


@pytest.mark.e2e
def test_wrong_type_for_a_field_is_a_clear_error(tmp_path):
    run = launch(tmp_path / "w", "--config.trainer.train_steps=abc")
    assert run.returncode != 0
    assert "train_steps" in run.stderr and "abc" in run.stderr
    assert not (tmp_path / "w").exists()


def test_batch_larger_than_the_dataset(tmp_path):
    config = tiny_config(**{"data.global_batch_size": 2048})
    trainer = Trainer(config, get_task(config), tf.distribute.get_strategy(),
                      str(tmp_path))
    with pytest.raises(ValueError, match="global_batch_size=2048 is larger than the 1024"):
        trainer.train()
    assert os.listdir(tmp_path) == []


@pytest.mark.e2e
def test_a_file_beside_the_config_never_shadows_a_standard_module(tmp_path):
    # The user's task module imports `wave` (standard, imported by nothing before it); a
    # wave.py beside the config in a shared folder must not be what it gets.
    (tmp_path / "wave.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    (tmp_path / "my_task.py").write_text("import wave\nassert hasattr(wave, 'open')\n")
    (tmp_path / "config.py").write_text(
        "from configs import cifar\n\ndef get_config():\n    c = cifar.get_config()\n"
        "    c.task.module = 'my_task'\n    return c\n")
    (tmp_path / "run").mkdir()
    run = launch(tmp_path / "run", "--mode=export", config=str(tmp_path / "config.py"))
    assert "Nothing to export" in run.stderr, run.stderr[-2000:]  # my_task imported fine
    assert not (tmp_path / "ran").exists()


@pytest.mark.e2e
def test_second_launch_on_a_busy_workdir_is_refused(tmp_path):
    from trainer.state.workdir_lock import WorkdirLock
    with WorkdirLock(str(tmp_path)):
        run = launch(tmp_path, *TINY, "--config.trainer.train_steps=4")
    assert run.returncode != 0
    assert f"held by pid {os.getpid()}" in run.stderr
    assert sorted(os.listdir(tmp_path)) == []  # the lock was released; nothing written


def test_a_whole_run_on_a_remote_workdir_writes_nothing_locally(tmp_path, monkeypatch):
    """ram:// (TensorFlow's in-memory filesystem) stands in for gs://: every file the run
    writes goes through tf.io.gfile, so nothing lands on the local disk."""
    from trainer import cli
    monkeypatch.chdir(tmp_path)
    workdir = "ram://runs/remote"
    config = tiny_config(**{"trainer.train_steps": 10, "trainer.checkpoint_every": 5,
                            "trainer.eval_every": 10})
    cli.execute(config, workdir, "train_and_eval")
    gfile = tf.io.gfile
    assert json.loads(gfile.GFile(f"{workdir}/config.json").read())["trainer"]["train_steps"] == 10
    assert tf.train.latest_checkpoint(f"{workdir}/checkpoints").endswith("ckpt-10")
    for run in ("train", "eval"):
        assert gfile.glob(f"{workdir}/{run}/events.out.tfevents.*"), run
    assert not gfile.exists(f"{workdir}/.lock")  # released
    assert os.listdir(tmp_path) == []  # no ./ram:/... folder, nothing else
    cli.execute(config, workdir, "eval")  # and it reads back from there:
    accuracy = scalars(workdir, "eval")["accuracy"]  # the same step, the same weights
    assert [step for step, _ in accuracy] == [10, 10] and accuracy[0][1] == accuracy[1][1]


class _Strategy:
    def __init__(self, resolver):
        self.cluster_resolver = resolver


@pytest.mark.parametrize("cluster,task_type,task_id,chief", [
    ({"worker": ["a:1", "b:1"]}, "worker", 0, True),
    ({"worker": ["a:1", "b:1"]}, "worker", 1, False),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "worker", 0, False),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "chief", 0, True),
])
def test_one_writer_per_job_by_task_identity(cluster, task_type, task_id, chief):
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id)
    assert is_chief(_Strategy(resolver)) is chief


def test_single_client_strategies_are_their_own_chief():
    assert is_chief(tf.distribute.get_strategy()) and is_chief(two_replicas())
    assert is_chief(_Strategy(None))


FILL_DISK = '''
import glob
import os


def fill(controller, step, logs):
    """Leaves half a checkpoint free on the workdir's filesystem, once the checkpoint is
    written: room for the small files, not for another checkpoint."""
    checkpoints = controller.trainer.checkpoints
    size = sum(os.path.getsize(p) for p in glob.glob(checkpoints.latest + ".*"))
    free = os.statvfs(controller.trainer.workdir)
    with open(os.path.join(os.path.dirname(controller.trainer.workdir), "filler"), "wb") as f:
        f.write(b"\\0" * (free.f_bavail * free.f_frsize - size // 2))
'''


@pytest.mark.e2e
def test_a_full_disk_is_told_plainly_and_a_relaunch_after_freeing_space_finishes(tmp_path):
    from trainer import cli
    disk = tmp_path / "disk"  # a small filesystem of its own
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (tmp_path / "fill_disk.py").write_text(FILL_DISK)
        (tmp_path / "full_config.py").write_text(
            "from configs import cifar\n\n\ndef get_config():\n    c = cifar.get_config()\n"
            "    c.actions.fill = dict(action='fill_disk.fill', every=10)\n    return c\n")
        workdir = disk / "run"
        args = [*TINY, "--config.model.name=resnet", "--config.model.width=4",
                "--config.model.blocks_per_stage=1", "--config.trainer.jit_compile=off",
                "--config.trainer.train_steps=30", "--config.trainer.checkpoint_every=10",
                "--config.trainer.eval_every=0", "--config.trainer.log_every=0",
                "--config.trainer.async_checkpoint=on"]
        run = launch(workdir, *args, config=str(tmp_path / "full_config.py"))
        assert run.returncode == 28, run.stderr[-3000:]
        assert "Traceback" not in run.stderr, run.stderr[-3000:]
        assert re.search(r"No space left on device writing .*The last complete checkpoint is "
                         rf"{workdir}/checkpoints/ckpt-10; .*relaunch with the same --workdir",
                         run.stderr)
        summary = json.load(open(workdir / "summary.json"))
        assert summary["stopped"].startswith("DiskFull: No space left on device")
        assert not list((workdir / "checkpoints").glob("*_temp"))  # the cut-short write

        (disk / "filler").unlink()
        (workdir / "checkpoints" / "ckpt-25_temp").mkdir()  # as a kill mid-write leaves it
        config = tiny_config(**{  # as `args`, without the filling action, in this process
            "model.name": "resnet", "model.width": 4, "model.blocks_per_stage": 1,
            "trainer.train_steps": 30, "trainer.checkpoint_every": 10,
            "trainer.eval_every": 0, "trainer.log_every": 0, "trainer.async_checkpoint": "on"})
        cli.execute(config, str(workdir), "train_and_eval")
        summary = json.load(open(workdir / "summary.json"))
        assert summary["steps"] == 30 and summary["steps_this_run"] == 20  # from ckpt-10
        assert not (workdir / "checkpoints" / "ckpt-25_temp").exists()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
