"""Model FLOPs against hand counts, peaks, and MFU in the log, TensorBoard and summary.json."""

import json

import keras
import pytest
import tensorflow as tf
from tensorflow.python.util import deprecation

from trainer.task import get_task
from support import build, scalars, tiny_config, two_replicas
from trainer.data.tokenizers import ByteTokenizer
from support.lm import tiny_lm
from trainer.runtime import host
from trainer.step import flops


def test_a_dense_models_forward_flops_are_the_hand_count():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    # per Dense: 2 x in x out (multiply-adds) + out (bias); the ReLU counts none
    hand = (2 * 3 * 64 + 64) + (2 * 64 * 1 + 1)
    assert flops.forward_flops(model, tf.TensorSpec([1, 3], tf.float32)) == hand


def test_einsums_are_counted():
    """The profiler counts no Einsum: an EinsumDense (as in attention) is added by hand."""
    model = keras.Sequential([keras.Input((5, 8)),
                              keras.layers.EinsumDense("abc,cd->abd", (5, 16))])
    assert flops.forward_flops(model, tf.TensorSpec([1, 5, 8], tf.float32)) == 2 * 5 * 8 * 16


def test_the_lm_count_follows_its_weights(tmp_path):
    """6 x tokens x matmul weights (read off the built model) + causal attention."""
    config = tiny_lm(tmp_path, **{"model.num_layers": 2})
    T, L, d = config.model.seq_len, config.model.num_layers, config.model.d_model
    task = get_task(config)
    model = task.build_model()
    matmul_weights = sum(v.numpy().size for v in model.trainable_variables
                         if v.path.endswith("kernel")) + d * ByteTokenizer.identity["vocab_size"]  # + the tied head
    assert task.flops_per_example() == 6 * T * matmul_weights + 6 * L * T * T * d


def test_peaks_of_known_accelerators_and_the_override(monkeypatch):
    strategy = tf.distribute.get_strategy()
    assert flops.peak_flops(strategy, "bfloat16", 100.0) == (100e12, "trainer.peak_tflops")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["gpu"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details",
                        lambda device: {"device_name": "NVIDIA A100-SXM4-40GB"})
    assert flops.peak_flops(strategy, "bfloat16")[0] == 312e12
    peak, why = flops.peak_flops(strategy, "float64")  # not in the table
    assert peak is None and "trainer.peak_tflops" in why


def test_counting_flops_logs_no_v1_deprecation_noise(monkeypatch, caplog):
    """The profiler's code calls a deprecated v1 function: TensorFlow warns once a
    process (forgotten here, so this test sees it whatever ran before)."""
    monkeypatch.setattr(deprecation, "_PRINTED_WARNING", {})
    caplog.set_level("WARNING")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    assert flops.forward_flops(model, tf.TensorSpec([1, 3], tf.float32)) == 2 * 3 * 4 + 4
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]
    assert flops._not_profiler_noise not in tf.get_logger().filters  # gone after


def test_the_cpu_peak_is_measured_once_per_machine_and_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    monkeypatch.setattr(flops, "_matmul_flops",
                        lambda dtype: measured.append(dtype) or (5e11, 0.02))
    path = tmp_path / "tftrainer" / "cpu_peak.json"
    assert flops.cpu_peak("bfloat16") == (
        5e11, f"bfloat16 matmul on this CPU, measured now, cached in {path}")
    assert flops.cpu_peak("bfloat16") == (5e11, f"bfloat16 matmul on this CPU, read from {path}")
    assert flops.cpu_peak("float32")[0] == 5e11 and measured == ["bfloat16", "float32"]
    cores = f"{host.cores()} cores"
    assert [k.split(", ")[-2:] for k in json.loads(path.read_text())] == [
        [cores, "bfloat16"], [cores, "float32"]]  # after the CPU's model name
    path.write_text('{"half a cache')  # corrupt: measured again and rewritten
    assert "measured now" in flops.cpu_peak("bfloat16")[1] and len(measured) == 3
    assert list(json.loads(path.read_text()).values()) == [5e11]
    assert "read from" in flops.cpu_peak("bfloat16")[1] and len(measured) == 3


def test_a_peak_timed_while_other_processes_ran_is_not_kept(tmp_path, monkeypatch):
    peak, others = flops._matmul_flops("float32", size=64, seconds=0.0)
    assert peak > 0 and others >= 0  # the real timing: its figures vary
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(flops, "_matmul_flops", lambda dtype: (2.5e11, 0.5))  # half the CPU
    assert flops.cpu_peak("bfloat16") == (2.5e11, "bfloat16 matmul on this CPU, measured "
                                          "now, not cached: other processes had 50% of the "
                                          "CPU meanwhile")
    assert not (tmp_path / "tftrainer" / "cpu_peak.json").exists()


def test_a_cache_that_cannot_be_written_costs_a_measurement_not_the_run(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # no directory in a file
    monkeypatch.setattr(flops, "_matmul_flops", lambda dtype: (5e11, 0.0))
    peak, source = flops.cpu_peak("float32")
    assert peak == 5e11 and "measured now, not cached: " in source
    monkeypatch.delenv("XDG_CACHE_HOME")  # the default: ~/.cache
    monkeypatch.setenv("HOME", str(tmp_path))
    default = tmp_path / ".cache" / "tftrainer" / "cpu_peak.json"
    assert flops.cpu_peak("float32")[1].endswith(f"cached in {default}")


@pytest.mark.parametrize("replicas", [1, 2])
def test_mfu_in_the_log_tensorboard_and_summary(tmp_path, caplog, monkeypatch, replicas):
    """With 2 replicas a step's FLOPs are those of the same global batch on 1, and the
    CPU's peak is the same: both replicas share its cores."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    caplog.set_level("INFO")
    trainer = build(tiny_config(**{"trainer.train_steps": 10, "trainer.eval_every": 0}),
                    tmp_path, two_replicas() if replicas == 2 else None)
    assert trainer.strategy.num_replicas_in_sync == replicas
    trainer.train()
    per_step, peak = trainer.utilization.counted
    cnn = 3 * flops.forward_flops(trainer.model, tf.TensorSpec([1, 32, 32, 3], tf.float32))
    assert per_step == cnn * 32  # the seed CNN's graph count, 32 examples a step
    assert peak == flops._matmul_flops("float32")[0]  # this process's timing (cached or not)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Model FLOPs per step") and f"peak: {peak:.4g} FLOP/s (float32 "
               "matmul on this CPU, measured now, " in m for m in messages)
    lines = [m for m in messages if m.startswith("step ")]
    assert lines and all("MFU " in line for line in lines)
    mfu = [v for _, v in scalars(tmp_path, "train")["mfu"]]
    assert len(mfu) == 2 and all(0 < m < 1 for m in mfu)  # at steps 5 and 10
    summary = json.load(open(tmp_path / "summary.json"))
    assert 0 < summary["mfu"] < 1 and summary["model_flops_per_step"] == per_step
    # the figure is FLOPs x steps/sec over the measured peak of this CPU's matmul
    steps_per_sec = summary["steps_this_run"] / summary["seconds"]["train"]
    assert summary["mfu"] == pytest.approx(per_step * steps_per_sec / peak, rel=0.05)
