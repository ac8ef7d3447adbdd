"""Model FLOPs against hand counts, peaks, and MFU in the log, TensorBoard and summary.json."""

import json

import keras
import pytest
import tensorflow as tf

import tasks
from conftest import build, scalars, tiny_config
from tasks.lm import VOCAB
from test_transformers import tiny_lm
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
    task = tasks.get_task(config)
    model = task.build_model()
    matmul_weights = sum(v.numpy().size for v in model.trainable_variables
                         if v.path.endswith("kernel")) + d * VOCAB  # + the tied head
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


def test_mfu_in_the_log_tensorboard_and_summary(tmp_path, caplog):
    caplog.set_level("INFO")
    trainer = build(tiny_config(**{"trainer.train_steps": 10, "trainer.eval_every": 0}),
                    tmp_path)
    trainer.train()
    per_step = trainer.utilization.counted[0]
    cnn = 3 * flops.forward_flops(trainer.model, tf.TensorSpec([1, 32, 32, 3], tf.float32))
    assert per_step == cnn * 32  # the seed CNN's graph count, 32 examples a step
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert lines and all("MFU " in line for line in lines)
    mfu = [v for _, v in scalars(tmp_path, "train")["mfu"]]
    assert len(mfu) == 2 and all(0 < m < 1 for m in mfu)  # at steps 5 and 10
    summary = json.load(open(tmp_path / "summary.json"))
    assert 0 < summary["mfu"] < 1 and summary["model_flops_per_step"] == per_step
    # the figure is FLOPs x steps/sec over the measured peak of this CPU's matmul
    steps_per_sec = summary["steps_this_run"] / summary["seconds"]["train"]
    peak = flops.measured_cpu_peak("float32")
    assert summary["mfu"] == pytest.approx(per_step * steps_per_sec / peak, rel=0.05)
