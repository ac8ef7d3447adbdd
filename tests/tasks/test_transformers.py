"""Byte LM and ViT: learning, causality, remat, exact eval, sampling, mixed precision."""

import os
import subprocess
import sys

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from trainer.task import get_task
from configs import vit_cifar
import support
from support import ROOT, scalars, tiny_config, two_replicas
from support.lm import tiny_lm
from tasks.models.decoder import DecoderLM

def build(config, workdir, strategy=None):
    return support.build(config, workdir / "run", strategy)


def test_tiny_lm_overfits_repeated_text(tmp_path):
    trainer = build(tiny_lm(tmp_path), tmp_path)
    results = trainer.train()
    logged = scalars(tmp_path / "run", "train")  # the last log interval's loss in bits, accuracy
    bits = [v for _, v in logged["bits_per_byte"]]
    assert bits == sorted(bits, reverse=True) and bits[-1] < 1.0, bits
    assert logged["accuracy"][-1][1] > 0.8, logged["accuracy"]
    assert results["bits_per_byte"] < 1.0 and results["accuracy"] > 0.8, results
    # the eval wrote what the model says after the prompt to TensorBoard
    texts = {(e.step, v.tag): tf.make_ndarray(v.tensor).item().decode()
             for path in tf.io.gfile.glob(str(tmp_path / "run/eval/events.*"))
             for e in tf.compat.v1.train.summary_iterator(path) for v in e.summary.value
             if v.metadata.plugin_data.plugin_name == "text"}
    sample = trainer.task.eval_sample(trainer.model)
    assert sample.startswith("import ") and len(sample) > 100
    assert texts == {(150, "sample"): "```\n" + sample + "\n```"}


def test_causal_logits_ignore_future_bytes():
    model = DecoderLM(vocab_size=256, seq_len=16, num_layers=2, d_model=32, num_heads=4, mlp_dim=64)
    tokens = np.random.default_rng(0).integers(0, 256, size=(2, 16)).astype(np.int32)
    changed = tokens.copy()
    t = 6
    changed[:, t + 1:] = (changed[:, t + 1:] + 17) % 256
    a, b = model(tokens).numpy(), model(changed).numpy()
    np.testing.assert_allclose(a[:, :t + 1], b[:, :t + 1], atol=1e-5)
    assert not np.allclose(a[:, t + 1:], b[:, t + 1:])


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_remat_gives_same_loss_and_gradients(dropout):
    tokens = np.random.default_rng(1).integers(0, 256, size=(4, 16)).astype(np.int32)
    results = []
    for remat in (False, True):
        keras.utils.set_random_seed(3)
        model = DecoderLM(vocab_size=256, seq_len=16, num_layers=2, d_model=32, num_heads=4, mlp_dim=64,
                       dropout=dropout, remat=remat)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                tokens, model(tokens, training=True), from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        results.append((loss.numpy(), [g.numpy() if not isinstance(g, tf.IndexedSlices)
                                       else tf.convert_to_tensor(g).numpy() for g in grads]))
    (loss0, grads0), (loss1, grads1) = results
    np.testing.assert_allclose(loss0, loss1, rtol=1e-6)
    assert len(grads0) == len(grads1)
    for g0, g1 in zip(grads0, grads1):
        np.testing.assert_allclose(g0, g1, rtol=1e-4, atol=1e-6)


def test_eval_scores_every_validation_byte_once(tmp_path):
    text = bytes(np.random.default_rng(2).integers(32, 127, size=1000).astype(np.uint8))
    config = tiny_lm(tmp_path, text, **{"data.global_batch_size": 4,
                                         "data.validation_fraction": 0.237})
    trainer = build(config, tmp_path, strategy=two_replicas())
    results = trainer.evaluate()
    n_val = int(len(text) * 0.237)
    assert results["scored_tokens"] == n_val  # 237 targets: 7 windows of 32 + 13 left over

    val = np.frombuffer(text, np.uint8)[-n_val - 1:].astype(np.int32)
    all_losses = []
    for start in range(0, n_val, 32):
        window = val[start:start + 33]
        out = trainer.model(window[None, :-1], training=False).numpy()
        all_losses.append(keras.losses.sparse_categorical_crossentropy(
            window[None, 1:], out, from_logits=True).numpy().ravel())
    per_byte = np.concatenate(all_losses)
    assert len(per_byte) == n_val
    np.testing.assert_allclose(results["loss"], per_byte.mean(), rtol=1e-5)
    np.testing.assert_allclose(results["bits_per_byte"], per_byte.mean() / np.log(2), rtol=1e-5)


def test_empty_glob_is_a_clear_error(tmp_path):
    config = tiny_lm(tmp_path, **{"data.files": str(tmp_path / "nothing" / "*.txt")})
    task = get_task(config)
    with pytest.raises(FileNotFoundError, match=r"nothing/\*\.txt.*matches no files"):
        task.build_model() and task.splits


@pytest.mark.e2e
def test_sample_mode_prints_the_prompt_and_its_continuation_reproducibly(tmp_path):
    config = tiny_lm(tmp_path, **{"trainer.train_steps": 20, "trainer.steps_per_loop": 10,
                                  "trainer.log_every": 10, "optimizer.warmup_steps": 2})
    build(config, tmp_path).train(evaluate=False)
    args = [sys.executable, "launch.py", "--config=configs/lm.py",
            f"--workdir={tmp_path / 'run'}", "--mode=sample",
            "--config.precision=float32", "--config.distribution.strategy=default",
            f"--config.data.files={config.data.files}", "--config.data.validation_fraction=0.1",
            "--config.model.seq_len=32", "--config.model.num_layers=1",
            "--config.model.d_model=32", "--config.model.num_heads=2",
            "--config.model.mlp_dim=64", "--config.sample.prompt=the ",
            "--config.sample.num_tokens=40", "--config.sample.top_k=5"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen(args + extra, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for extra in ([], [], ["--config.sample.seed=1"])]  # side by side: quicker
    outs = [subprocess.CompletedProcess(p.args, 0, *p.communicate(timeout=300)) for p in procs]
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out.stderr.decode()[-2000:]
    first = outs[0].stdout.decode()  # the prompt, 40 sampled bytes as UTF-8, a newline
    assert first.startswith("the ") and first.endswith("\n") and len(first) > 4 + 1, first
    assert outs[1].stdout == outs[0].stdout        # same seed, same text
    assert outs[2].stdout != outs[0].stdout        # another seed, other text


def test_generation_samples_exactly_num_tokens(tmp_path):
    config = tiny_lm(tmp_path)
    task = get_task(config)
    model = task.build_model()
    out = task.sample_tokens(model, list(b"fox"), 50, temperature=1.0, top_k=0, seed=4)
    assert len(out) == 50 and all(0 <= t < 256 for t in out)
    assert out == task.sample_tokens(model, list(b"fox"), 50, temperature=1.0, top_k=0, seed=4)
    config.sample.update(temperature=1.0, top_k=0, seed=4)
    assert task.generate(model, "fox", 50) == bytes(b"fox" + bytes(out)).decode(
        "utf-8", errors="replace")


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_vit_trains_on_synthetic_cifar(tmp_path, precision):
    c = vit_cifar.get_config()
    small = tiny_config()
    c.data, c.distribution, c.precision = small.data, small.distribution, precision
    c.model.update(num_layers=1, d_model=32, num_heads=2, mlp_dim=64)
    c.optimizer.update(warmup_steps=2, clip_norm=1.0)
    c.trainer = ml_collections.ConfigDict(small.trainer.to_dict())
    c.trainer.update(train_steps=30, eval_every=30)
    trainer = build(c, tmp_path)
    assert trainer.model.name.startswith("vi_t") or "ViT" in type(trainer.model).__name__
    before = trainer.evaluate()["loss"]
    after = trainer.train()["loss"]
    assert after < before


def test_lm_mixed_bfloat16_runs(tmp_path):
    trainer = build(tiny_lm(tmp_path, precision="mixed_bfloat16",
                            **{"trainer.train_steps": 20, "trainer.steps_per_loop": 10,
                               "trainer.log_every": 10, "optimizer.warmup_steps": 2}), tmp_path)
    results = trainer.train()
    assert trainer.model.blocks[0].compute_dtype == "bfloat16"
    assert np.isfinite(results["loss"]) and results["bits_per_byte"] < 8.0


def test_the_lm_evaluation_computes_the_cross_entropy_once(tmp_path):
    """bits_per_byte is the eval loss in bits, not a second softmax cross-entropy."""
    trainer = build(tiny_lm(tmp_path), tmp_path / "run")
    results = trainer.evaluate()
    assert results["bits_per_byte"] == pytest.approx(results["loss"] / np.log(2), rel=1e-6)
    graph = trainer.evaluation._loop.get_concrete_function(
        iter(trainer._eval_dataset)).graph.as_graph_def()
    ops = [n.op for n in graph.node] + [n.op for f in graph.library.function
                                        for n in f.node_def]
    # (under op determinism, which other tests turn on, TensorFlow computes it as a
    # LogSoftmax and a gather)
    assert ops.count("SparseSoftmaxCrossEntropyWithLogits") + ops.count("LogSoftmax") == 1
