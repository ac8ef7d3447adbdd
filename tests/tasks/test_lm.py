"""The language model on token shards: learning, the fixed eval windows and bits per
byte for each tokenizer, the document mask, cached sampling, and the same examples per
step on any topology."""

import json
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import support
from support import ROOT, kill_relaunch_and_compare, scalars, two_replicas
from support.lm import TEXT, prose, tiny_lm, write_corpus
from tasks.models.decoder import DecoderLM
from tasks.models.generation import GraphTokenizer, Sampler
from trainer.data import token_windows
from trainer.data.tokenizers import ByteTokenizer
from trainer.actions.export import export
from trainer.task import get_task


def build(config, workdir, strategy=None):
    return support.build(config, workdir / "run", strategy)


def launch(*args):
    """launch.py with `args`, which must succeed."""
    run = subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def spm_lm(tmp_path, **overrides):
    """tiny_lm on varied text, with a SentencePiece vocabulary trained when preparing."""
    return tiny_lm(tmp_path, prose(20_000), **{
        "tokenizer.kind": "sentencepiece", "tokenizer.vocab_size": 300, **overrides})


def test_tiny_lm_overfits_repeated_text(tmp_path):
    trainer = build(tiny_lm(tmp_path), tmp_path)
    results = trainer.train()
    logged = scalars(tmp_path / "run", "train")  # the last log interval's loss in bits, accuracy
    bits = [v for _, v in logged["bits_per_byte"]]
    assert bits == sorted(bits, reverse=True) and bits[-1] < 1.0, bits
    assert results["bits_per_byte"] < 1.0 and results["accuracy"] > 0.8, results
    texts = {(e.step, v.tag): tf.make_ndarray(v.tensor).item().decode()
             for path in tf.io.gfile.glob(str(tmp_path / "run/eval/events.*"))
             for e in tf.compat.v1.train.summary_iterator(path) for v in e.summary.value
             if v.metadata.plugin_data.plugin_name == "text"}
    sample = trainer.task.eval_sample(trainer.model)
    assert sample.startswith("import ") and len(sample) > 60, sample
    assert texts == {(150, "sample"): "```\n" + sample + "\n```"}


def test_eval_scores_the_same_spread_windows_once(tmp_path):
    text = bytes(np.random.default_rng(2).integers(32, 127, size=3000).astype(np.uint8))
    config = tiny_lm(tmp_path, text, **{"data.global_batch_size": 4,
                                        "data.eval_windows": 5})
    trainer = build(config, tmp_path, strategy=two_replicas())
    results = trainer.evaluate()
    assert results["scored_tokens"] == 5 * 32
    assert results == trainer.evaluate()  # the same windows every time

    _, _, _, held_out = trainer.task.corpus
    starts = token_windows.eval_indices(held_out, 32, 5) * 32
    assert len(set(starts)) == 5 and starts[-1] > len(held_out.tokens) // 2  # spread out
    windows = held_out.windows(starts, 33)
    logits = trainer.model(windows[:, :-1], training=False)
    losses = keras.losses.sparse_categorical_crossentropy(windows[:, 1:], logits,
                                                          from_logits=True).numpy()
    np.testing.assert_allclose(results["loss"], losses.mean(), rtol=1e-5)
    # bytes: each target is one byte (the separator counts one)
    np.testing.assert_allclose(results["bits_per_byte"], losses.mean() / math.log(2),
                               rtol=1e-5)


def test_bits_per_byte_counts_the_bytes_each_piece_stands_for(tmp_path):
    config = spm_lm(tmp_path, **{"data.eval_windows": 0})
    trainer = build(config, tmp_path)
    tokenizer = trainer.task.tokenizer
    sample = "caf\u00e9 \u2603\U0001f600 the model\n  reads 127".encode()
    ids = tokenizer.encode(sample)
    assert tokenizer.decode(ids) == sample.decode()  # byte fallback: nothing unknown
    assert tokenizer.token_bytes()[ids].sum() == len(sample)
    results = trainer.evaluate()
    _, _, _, held_out = trainer.task.corpus
    n = token_windows.count(held_out, 32)
    targets = held_out.windows(np.arange(n) * 32, 33)[:, 1:]
    assert results["scored_tokens"] == targets.size
    assert results["target_bytes"] == tokenizer.token_bytes()[targets].sum()
    assert results["target_bytes"] > 1.5 * results["scored_tokens"]  # pieces, not bytes
    np.testing.assert_allclose(results["bits_per_byte"], results["loss"] / math.log(2)
                               * targets.size / results["target_bytes"], rtol=1e-6)


def test_the_document_mask_keeps_attention_inside_each_document():
    separator = 256
    tokens = np.random.default_rng(0).integers(0, 256, size=(2, 16)).astype(np.int32)
    tokens[:, 6] = separator  # a document starts at position 6
    changed = tokens.copy()
    changed[:, :6] = (changed[:, :6] + 17) % 256  # the document before it
    for mask, inside in ((separator, True), (None, False)):
        keras.utils.set_random_seed(0)
        model = DecoderLM(257, 16, 2, 32, 4, 64, separator=mask)
        a, b = model(tokens).numpy(), model(changed).numpy()
        assert np.allclose(a[:, 6:], b[:, 6:], atol=1e-5) == inside


@pytest.mark.parametrize("separator", [None, 256])
def test_cached_sampling_gives_the_logits_of_the_whole_window(separator):
    keras.utils.set_random_seed(1)
    model = DecoderLM(257, 16, 2, 32, 4, 64, separator=separator)
    sampler = Sampler(model, GraphTokenizer(ByteTokenizer()), 16)
    tokens = np.random.default_rng(3).integers(0, 256, size=(2, 16)).astype(np.int32)
    tokens[0, 9] = tokens[1, 4] = 256
    full = model(tokens).numpy()
    logits, cache = sampler.prefill(tf.constant(tokens[:, :8]))
    np.testing.assert_allclose(logits, full[:, 7], atol=1e-4)
    for position in range(8, 16):
        logits, cache = sampler.extend(tf.constant(tokens[:, position]),
                                       tf.constant(position), cache)
        np.testing.assert_allclose(logits, full[:, position], atol=1e-4, err_msg=position)


def test_generation_is_reproducible_and_ends_with_the_document(tmp_path):
    config = tiny_lm(tmp_path)
    task = get_task(config)
    model = task.build_model()
    config.sample.update(temperature=1.0, top_k=0, seed=4)
    text = task.generate(model, "fox", num_tokens=50)
    assert text.startswith("fox") and 3 < len(text) <= 3 + 50  # (a byte: a character at most)
    assert text == task.generate(model, "fox", num_tokens=50)
    config.sample.seed = 5
    assert text != task.generate(model, "fox", num_tokens=50)
    # A model that always predicts the separator ends every document at once: the final
    # LayerNorm outputs ones, and only the separator's (tied) embedding is not zero.
    embeddings = np.zeros(model.embed.embeddings.shape, np.float32)
    embeddings[256] = 1.0
    model.embed.embeddings.assign(embeddings)
    model.ln.gamma.assign(tf.zeros_like(model.ln.gamma))
    model.ln.beta.assign(tf.ones_like(model.ln.beta))
    assert task.generate(model, "fox", num_tokens=50) == "fox"


@pytest.mark.parametrize("topology", [(1, 2), (2, 2), (2, 4)])
def test_each_step_reads_the_examples_of_one_process_on_any_topology(tmp_path, topology):
    """(input pipelines = workers, replicas in all): the global batch of each step, also
    from a step resumed on that topology, is what one process with one replica reads."""
    config = tiny_lm(tmp_path, prose(6000), **{"data.global_batch_size": 8})
    task = get_task(config)

    def steps(pipelines, replicas, start, count):
        """The sorted windows of `count` global batches from step `start`."""
        per_pipeline = []
        for p in range(pipelines):
            context = tf.distribute.InputContext(pipelines, p, replicas)
            batches = task.build_inputs("train", context, start).take(
                count * replicas // pipelines)
            per_pipeline.append([x for x, _ in batches.as_numpy_iterator()])
        # replica batch g of the stream: pipeline g % pipelines, its (g // pipelines)-th
        stream = [per_pipeline[g % pipelines][g // pipelines]
                  for g in range(count * replicas)]
        return [sorted_rows(np.concatenate(stream[s * replicas:(s + 1) * replicas]))
                for s in range(count)]

    one = steps(1, 1, 0, 6)
    assert len({tuple(r) for step in one for r in step}) == 6 * 8  # 48 distinct windows
    for a, b in zip(one, steps(*topology, 0, 6)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(one[4:], steps(*topology, 4, 2)):  # resumed at step 4 elsewhere
        np.testing.assert_array_equal(a, b)


def sorted_rows(rows):
    """The windows of a global batch in one order, whichever replica read each."""
    return rows[np.lexsort(rows.T[::-1])]


def test_training_windows_are_the_packed_documents(tmp_path):
    config = tiny_lm(tmp_path, **{"data.train": write_corpus(tmp_path / "docs", [
        b"first document", b"second", TEXT])})
    task = get_task(config)
    _, _, train, _ = task.corpus
    assert [bytes(train.document(i).astype(np.uint8)) for i in range(3)] == [
        b"first document", b"second", TEXT]
    assert list(train.tokens[:16]) == [256, *b"first document", 256]
    windows = train.windows(np.arange(token_windows.count(train, 32)) * 32, 33)
    np.testing.assert_array_equal(windows[1, 0], windows[0, 32])  # consecutive, sharing one


def test_the_lm_evaluation_computes_the_cross_entropy_once(tmp_path):
    """bits_per_byte comes from the eval loss, not a second softmax cross-entropy."""
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


def test_lm_mixed_bfloat16_runs(tmp_path):
    trainer = build(tiny_lm(tmp_path, precision="mixed_bfloat16",
                            **{"trainer.train_steps": 20, "trainer.steps_per_loop": 10,
                               "trainer.log_every": 10, "optimizer.warmup_steps": 2,
                               "data.document_mask": True}), tmp_path)
    results = trainer.train()
    assert trainer.model.blocks[0].compute_dtype == "bfloat16"
    assert np.isfinite(results["loss"]) and results["bits_per_byte"] < 8.0


@pytest.mark.parametrize("kind", ["bytes", "sentencepiece"])
def test_the_export_serves_the_model_on_strings_tokenized_as_in_training(tmp_path, kind):
    config = (tiny_lm(tmp_path) if kind == "bytes" else spm_lm(tmp_path)).unlock()
    config.trainer.update(train_steps=4, steps_per_loop=2, log_every=2, checkpoint_every=4)
    config.optimizer.warmup_steps = 1
    config.sample.num_tokens = 12
    trainer = build(config, tmp_path)
    trainer.train(evaluate=False)
    served = tf.saved_model.load(export(config, trainer.task, str(tmp_path / "run")))
    texts = ["the model reads", "caf\u00e9 \u2603 \U0001f600", "", "x" * 100]
    outputs = served.signatures["serving_default"](text=tf.constant(texts))
    tokenizer, seq_len = trainer.task.tokenizer, config.model.seq_len
    windows = []
    for text in texts:  # as training reads a document: a separator, then its ids
        ids = [tokenizer.separator, *tokenizer.encode(text.encode())][-seq_len:]
        windows.append([tokenizer.separator] * (seq_len - len(ids)) + ids)
    expected = trainer.model(np.asarray(windows, np.int32), training=False)[:, -1].numpy()
    np.testing.assert_allclose(outputs["next_token_logits"], expected, rtol=1e-4, atol=1e-4)
    generated = served.generate(tf.constant(texts[:1]), tf.constant(config.sample.seed))
    assert texts[0] + generated[0].numpy().decode(errors="replace") == trainer.task.generate(
        trainer.model, texts[0])
    metadata = json.load(open(tmp_path / "run/export/4/assets.extra/export.json"))
    assert metadata["endpoints"] == ["serving_default", "generate"]
    assert metadata["settings"]["sample"]["num_tokens"] == 12
    assert metadata["settings"]["tokenizer"] == tokenizer.identity


SERVE = """
import sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SentencePiece ops the SavedModel holds)
loaded = tf.saved_model.load(sys.argv[1])
text = tf.constant(["the model reads", "caf\\u00e9 \\u2603", ""])
probabilities = loaded.signatures["serving_default"](text=text)["next_token_probabilities"]
first = loaded.generate(text, tf.constant(0))
again = loaded.generate(text, tf.constant(0))
print(probabilities.shape[0], probabilities.shape[1], float(tf.reduce_sum(probabilities[0])))
print(all(first.numpy() == again.numpy()), first.shape[0])
"""


@pytest.mark.e2e
def test_text_files_to_prepare_train_sample_and_an_export_that_takes_strings(tmp_path):
    """The user's path with SentencePiece, as README gives it: --mode=prepare, training on
    what it prepared (nothing prepared again), --mode=sample, --mode=export, and a fresh
    process serving the export on raw strings."""
    corpus = write_corpus(tmp_path / "text", [prose(3000, seed) for seed in range(12)])
    common = ["--config=configs/lm.py", f"--config.data.train={corpus}",
              f"--config.data.prepared={tmp_path / 'tokens'}", "--config.data.eval_fraction=0.2",
              "--config.tokenizer.kind=sentencepiece", "--config.tokenizer.vocab_size=300",
              "--config.precision=float32", "--config.distribution.strategy=default",
              "--config.model.seq_len=32", "--config.model.num_layers=1",
              "--config.model.d_model=32", "--config.model.num_heads=2",
              "--config.model.mlp_dim=64", "--config.data.document_mask=True",
              "--config.optimizer.warmup_steps=2", "--config.trainer.train_steps=10",
              "--config.trainer.steps_per_loop=5", "--config.trainer.log_every=5",
              "--config.sample.prompt=the ", "--config.sample.num_tokens=20"]
    run = launch(*common, f"--workdir={tmp_path / 'prepare'}", "--mode=prepare")
    assert "Trained a SentencePiece vocabulary of 300 pieces" in run.stderr
    assert "Ready:" in run.stderr and (tmp_path / "tokens" / "train.bin").exists()
    workdir = f"--workdir={tmp_path / 'run'}"
    run = launch(*common, workdir, "--mode=train_and_eval")
    assert "Preparing" not in run.stderr and "bits_per_byte=" in run.stderr
    # (the same text each time: test_generation_is_reproducible_and_ends_with_the_document)
    assert launch(*common, workdir, "--mode=sample").stdout.startswith("the ")
    launch(*common, workdir, "--mode=export")
    served = subprocess.run([sys.executable, "-c", SERVE, str(tmp_path / "run/export/10")],
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert served.returncode == 0, served.stderr[-3000:]
    sizes, generated = served.stdout.split("\n")[:2]
    rows, vocabulary, total = sizes.split()
    assert (rows, vocabulary) == ("3", "300") and abs(float(total) - 1) < 1e-4
    assert generated == "True 3"


@pytest.mark.e2e
def test_sigkill_and_relaunch_end_bitwise_equal_to_an_uninterrupted_run(tmp_path):
    """With dropout and the document mask; the two runs prepare the same shards at once
    (one prepares, the other waits for it)."""
    corpus = write_corpus(tmp_path / "text", [prose(2000, seed) for seed in range(8)])
    kill_relaunch_and_compare([
        "--config=configs/lm.py", f"--config.data.train={corpus}",
        f"--config.data.prepared={tmp_path / 'tokens'}", "--config.data.eval_fraction=0.3",
        "--config.precision=float32", "--config.distribution.strategy=default",
        "--config.model.seq_len=32", "--config.model.num_layers=1",
        "--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.mlp_dim=64",
        "--config.model.dropout=0.2", "--config.data.document_mask=True",
        "--config.data.global_batch_size=8", "--config.optimizer.warmup_steps=5",
        "--config.trainer.steps_per_loop=5", "--config.trainer.log_every=5",
        "--config.trainer.checkpoint_every=10", "--config.trainer.train_steps=30",
        "--config.trainer.deterministic=True", "--config.trainer.jit_compile=off",
        "--config.sample.summary_tokens=0", "--mode=train"], tmp_path)
