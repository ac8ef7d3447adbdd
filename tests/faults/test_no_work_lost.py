"""A signal, a corrupt checkpoint, a diverging run or a second run must cost no work."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.task import get_task
from support import (ROOT, build, checkpoint_steps, kill_relaunch_and_compare, tiny_config,
                     two_replicas)
from trainer import Trainer
from trainer.state.checkpoints import IncompatibleCheckpointError
from trainer.state.workdir import check_workdir
from trainer.state.workdir_lock import WorkdirLock


@pytest.mark.e2e
def test_sigterm_saves_and_relaunch_continues(tmp_path):
    args = [sys.executable, "launch.py", "--config=configs/cifar.py", f"--workdir={tmp_path}",
            "--mode=train", "--config.data.source=synthetic", "--config.precision=float32",
            "--config.distribution.strategy=default", "--config.data.global_batch_size=16",
            "--config.data.synthetic_train_size=256", "--config.data.synthetic_test_size=32",
            "--config.trainer.steps_per_loop=10", "--config.trainer.log_every=10",
            "--config.trainer.checkpoint_every=100000"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(args + ["--config.trainer.train_steps=100000"], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:  # wait until training is under way
        lines.append(line)
        if "step 20/" in line:
            break
    proc.send_signal(signal.SIGTERM)
    lines += proc.stderr.readlines()
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, "".join(lines)[-3000:]
    log = "".join(lines)
    assert "Received SIGTERM" in log and "Relaunch with the same --workdir" in log
    saved = checkpoint_steps(tmp_path / "checkpoints")
    assert len(saved) == 1 and saved[0] >= 20 and saved[0] % 10 == 0  # a loop boundary
    assert f"Stopped by SIGTERM at step {saved[0]}" in log
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["stopped"] == "stopped by SIGTERM" and summary["steps"] == saved[0]
    assert not os.path.exists(tmp_path / ".lock")

    final = saved[0] + 10
    run = subprocess.run(args + [f"--config.trainer.train_steps={final}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    # It restored the SIGTERM checkpoint and ran exactly the steps left.
    assert f"Restored {tmp_path}/checkpoints/ckpt-{saved[0]} (step {saved[0]})." in run.stderr
    assert f"step {final}/{final}" in run.stderr
    summary = json.load(open(tmp_path / "summary.json"))
    assert (summary["steps"], summary["steps_this_run"]) == (final, final - saved[0])
    assert checkpoint_steps(tmp_path / "checkpoints")[-1] == final


def test_corrupt_latest_checkpoint_falls_back_to_previous(tmp_path, caplog):
    config = tiny_config(**{"trainer.train_steps": 20, "trainer.checkpoint_every": 10})
    first = build(config, tmp_path)
    first.train(evaluate=False)
    assert checkpoint_steps(tmp_path / "checkpoints") == [10, 20]
    data = next(p for p in os.listdir(tmp_path / "checkpoints")
                if p.startswith("ckpt-20.data"))
    path = tmp_path / "checkpoints" / data
    path.write_bytes(path.read_bytes()[:100])  # truncate

    again = build(config, tmp_path)
    restored = again.restore()
    assert restored.endswith("ckpt-10") and int(again.step.numpy()) == 10
    assert any("ckpt-20" in r.getMessage() and "unreadable" in r.getMessage()
               for r in caplog.records)
    assert checkpoint_steps(tmp_path / "checkpoints") == [10, 20]  # nothing deleted
    assert os.path.exists(tmp_path / "checkpoints" / "ckpt-10.index")


def test_divergence_stops_with_a_clear_error_and_keeps_the_good_checkpoint(tmp_path):
    sgd = {"optimizer.name": "sgd", "optimizer.momentum": 0.0}  # (a restore is strict)
    good = build(tiny_config(**{"trainer.train_steps": 10, **sgd}), tmp_path)
    good.train(evaluate=False)
    before = [w.numpy() for w in good.model.weights]
    config = tiny_config(**{"trainer.train_steps": 40, "optimizer.learning_rate": 1e9, **sgd})
    trainer = build(config, tmp_path)
    with pytest.raises(FloatingPointError) as e:
        trainer.train(evaluate=False)
    message = str(e.value)
    assert "Training diverged at step" in message and "learning_rate" in message
    assert "ckpt-10" in message
    assert checkpoint_steps(tmp_path / "checkpoints") == [10]  # no checkpoint of the diverged run
    stopped = json.load(open(tmp_path / "summary.json"))["stopped"]
    assert stopped.startswith("Diverged: Training diverged at step")
    # The diagnosis replayed it: a layer's output overflowed float32 (lr 1e9).
    diagnosis = json.load(open(tmp_path / "diagnosis.json"))
    assert diagnosis["pass"] == "forward" and diagnosis["compute_dtype"] == "float32"
    assert diagnosis["layer"] in message and diagnosis["layer"] in stopped
    restored = build(tiny_config(**{"trainer.train_steps": 10, **sgd}), tmp_path)
    restored.restore()
    for a, b in zip(before, restored.model.weights):
        np.testing.assert_array_equal(a, b.numpy())


def test_second_run_on_a_workdir_is_refused(tmp_path):
    with WorkdirLock(str(tmp_path)):
        with pytest.raises(RuntimeError, match=rf"in use.*pid {os.getpid()}"):
            WorkdirLock(str(tmp_path)).acquire()
    assert not os.path.exists(tmp_path / ".lock")


@pytest.mark.e2e
def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(f'{{"pid": {dead.pid}, "host": "{socket.gethostname()}"}}')
    with WorkdirLock(str(tmp_path)) as lock:
        assert lock.held
    assert any("stale lock" in r.getMessage() for r in caplog.records)


def test_workdir_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("keep me")
    with pytest.raises(NotADirectoryError, match="is a file"):
        check_workdir(str(path))
    assert path.read_text() == "keep me"


def test_workdir_under_a_file_cannot_be_created(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(PermissionError, match="cannot be created"):
        check_workdir(str(tmp_path / "file" / "run"))


def test_train_input_resumes_at_the_step(tmp_path):
    """Batches from start_step=k are the batches k, k+1, ... of a run from step 0."""
    config = tiny_config(**{"data.global_batch_size": 8})
    task = get_task(config)
    ctx = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                     num_replicas_in_sync=2)
    from_zero = list(task.build_inputs("train", ctx, 0).take(10).as_numpy_iterator())
    from_three = list(task.build_inputs("train", ctx, 3).take(4).as_numpy_iterator())
    for (x0, y0), (x3, y3) in zip(from_zero[6:], from_three):  # 2 replica batches a step
        np.testing.assert_array_equal(x0, x3)
        np.testing.assert_array_equal(y0, y3)
    epoch = np.concatenate([y for _, y in task.build_inputs("train", ctx).take(
        1024 // 4).as_numpy_iterator()])
    assert np.array_equal(np.sort(epoch), np.sort(task.data.arrays["train"][1]))  # a permutation


MODELS_WITH_STATE = {
    # (a ResNet's batch normalization statistics: test_image_files.py, on TFRecords)
    # dropout (a Keras Dropout layer and the Block's stateless dropout): random masks
    "vit": ["--config=configs/vit_cifar.py", "--config.model.num_layers=1",
            "--config.model.d_model=16", "--config.model.num_heads=2",
            "--config.model.mlp_dim=32", "--config.model.dropout=0.2",
            "--config.optimizer.warmup_steps=5"],
}


@pytest.mark.e2e
@pytest.mark.parametrize("model", sorted(MODELS_WITH_STATE))
def test_sigkill_and_relaunch_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path, model):
    relaunch_log = kill_relaunch_and_compare([
        *MODELS_WITH_STATE[model], "--mode=train", "--config.data.source=synthetic",
        "--config.precision=float32", "--config.distribution.strategy=default",
        "--config.data.global_batch_size=16", "--config.data.synthetic_train_size=256",
        "--config.data.synthetic_test_size=32", "--config.trainer.steps_per_loop=5",
        "--config.trainer.log_every=5", "--config.trainer.checkpoint_every=10",
        "--config.trainer.train_steps=30", "--config.trainer.deterministic=True",
        "--config.trainer.jit_compile=off"], tmp_path)  # (auto could time the runs apart)
    assert "stale lock" in relaunch_log


def test_a_checkpoint_of_another_model_size_is_named_not_skipped(tmp_path):
    small = {"model.name": "resnet", "model.width": 4, "model.blocks_per_stage": 1,
             "trainer.train_steps": 4, "trainer.checkpoint_every": 2}
    build(tiny_config(**small), tmp_path).train(evaluate=False)
    assert checkpoint_steps(tmp_path / "checkpoints") == [2, 4]
    wider = build(tiny_config(**dict(small, **{"model.width": 8})), tmp_path)
    with pytest.raises(IncompatibleCheckpointError) as e:
        wider.train(evaluate=False)
    message = str(e.value)
    assert "ckpt-4 does not fit this run" in message  # the newest, no silent fallback
    # the variable and both shapes: the checkpoint's (width 4) and this run's (width 8)
    shapes = re.search(r"mismatched \(\d+\): conv2d/kernel: checkpoint \[([\d, ]+)\] "
                       r"float32, this run \[([\d, ]+)\] float32", message)
    assert shapes, message
    old, new = ([int(d) for d in g.split(",") if d.strip()] for g in shapes.groups())
    assert new[-1] == 2 * old[-1]
    assert "config.json" in message and "new --workdir" in message
    assert checkpoint_steps(tmp_path / "checkpoints") == [2, 4]  # nothing deleted or written
    assert json.load(open(tmp_path / "config.json"))["model"]["width"] == 4


def test_a_float32_checkpoint_resumed_in_float16_starts_the_loss_scale_afresh(tmp_path, caplog):
    caplog.set_level("INFO")
    build(tiny_config(**{"trainer.train_steps": 2}), tmp_path).train(evaluate=False)
    fp16 = build(tiny_config(precision="mixed_float16", **{"trainer.train_steps": 2}), tmp_path)
    fp16.restore()
    assert float(fp16.loss_scale.scale.numpy()) == 2.0**15  # not the float32 run's 1
    assert any("Loss scale starts at 32768" in r.getMessage() and "without float16 loss "
               "scaling" in r.getMessage() for r in caplog.records)


class BlocksInAList(keras.Model):
    """Keras 3 does not make layers held in a list checkpoint children of the model."""

    def __init__(self):
        super().__init__()
        self.blocks = [keras.layers.BatchNormalization() for _ in range(2)]
        self.head = keras.layers.Dense(2)

    def call(self, x, training=False):
        for block in self.blocks:
            x = block(x, training=training)
        return self.head(x)


def test_model_state_of_layers_in_a_list_is_checkpointed(tmp_path):
    from support.two_heads import TwoHeads

    class Task(TwoHeads):
        def build_model(self):
            model = BlocksInAList()
            model(tf.zeros((1, 8)))
            return model

    config = tiny_config()
    trainer = Trainer(config, Task(config, 1.0), tf.distribute.get_strategy(), str(tmp_path))
    names = [n for n in trainer.checkpoints.named["model"] if n.endswith("moving_mean")]
    assert len(names) == 2
    for i, name in enumerate(names):
        trainer.variable_names[name].assign(tf.fill([8], float(i + 1)))
    trainer.checkpoints.save()
    fresh = Trainer(config, Task(config, 1.0), tf.distribute.get_strategy(), str(tmp_path))
    fresh.restore()
    for i, name in enumerate(names):
        np.testing.assert_array_equal(fresh.variable_names[name].numpy(), float(i + 1))


def test_async_checkpoints_hold_the_values_of_their_step(tmp_path):
    # Two replicas (Mirrored variables, per-replica BN statistics): each checkpoint a
    # background thread writes while training goes on equals a blocking save's.
    config = {"model.name": "resnet", "model.width": 4, "model.blocks_per_stage": 1,
              "trainer.train_steps": 10, "trainer.checkpoint_every": 5,
              "trainer.deterministic": True}
    for mode in ("on", "off"):
        trainer = build(tiny_config(**config, **{"trainer.async_checkpoint": mode}),
                        tmp_path / mode, two_replicas())
        assert trainer.checkpoints.options.enable_async is (mode == "on")
        trainer.train(evaluate=False)
        assert checkpoint_steps(tmp_path / mode / "checkpoints") == [5, 10]
    for step in (5, 10):
        a, b = (tf.train.load_checkpoint(str(tmp_path / mode / f"checkpoints/ckpt-{step}"))
                for mode in ("on", "off"))
        names = [n for n in a.get_variable_to_shape_map() if n.startswith("model/")]
        assert len(names) > 20
        for name in names:
            np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name), err_msg=name)


def test_async_checkpoint_setting_is_checked():
    from trainer.state.checkpoints import async_checkpoint
    config = tiny_config().trainer
    assert async_checkpoint(config, two_replicas())
    with pytest.raises(ValueError, match="async_checkpoint='yes' must be 'on', 'off' or 'auto'"):
        async_checkpoint(tiny_config(**{"trainer.async_checkpoint": "yes"}).trainer,
                         two_replicas())


def test_a_failed_background_write_is_reported_and_the_previous_checkpoint_kept(tmp_path):
    trainer = build(tiny_config(**{"trainer.async_checkpoint": "on"}), tmp_path)
    trainer.checkpoints.save()  # ckpt-0, complete
    trainer.checkpoints.sync()
    trainer.step.assign(1)
    # A file where the write's temporary directory goes: the background write fails.
    (tmp_path / "checkpoints" / "ckpt-1_temp").write_text("in the way")
    trainer.checkpoints.save()  # returns at once; the failure happens in the thread
    with pytest.raises(RuntimeError, match=r"asynchronous write of checkpoint .*ckpt-1 "
                                           r"failed \(.*Not a directory.*previous checkpoint "
                                           r"is intact"):
        trainer.checkpoints.sync()
    assert checkpoint_steps(tmp_path / "checkpoints") == [0]
    assert build(tiny_config(), tmp_path).restore().endswith("ckpt-0")
    # The error was reported once: the next save works (TensorFlow would raise it again
    # there, and once more at exit), and the relaunch's cleanup removes what was in the way.
    trainer.checkpoints.prepare_for_writes()
    trainer.step.assign(2)
    trainer.checkpoints.save()
    trainer.checkpoints.sync()
    assert checkpoint_steps(tmp_path / "checkpoints") == [0, 2]
    assert not (tmp_path / "checkpoints" / "ckpt-1_temp").exists()


def test_a_failed_synchronous_write_removes_what_it_wrote(tmp_path):
    trainer = build(tiny_config(**{"trainer.async_checkpoint": "off"}), tmp_path)
    trainer.checkpoints.save()  # ckpt-0
    trainer.step.assign(1)
    (tmp_path / "checkpoints" / "ckpt-1_temp").write_text("in the way")  # the write fails
    with pytest.raises(tf.errors.OpError):
        trainer.checkpoints.save()
    assert not (tmp_path / "checkpoints" / "ckpt-1_temp").exists()
    assert checkpoint_steps(tmp_path / "checkpoints") == [0]
