"""Text classification: each format trains and evaluates (macro-F1 and the confusion
matrix in TensorBoard), exact resume, 2 replicas, the export on raw strings, the warm
start from a language model, keras_hub backbones from preset folders, and a resume on
other labels refused."""

import hashlib
import json

import numpy as np
import pytest
import tensorflow as tf

import support
from support import two_replicas
from support.lm import prose, tiny_lm
from support.text_data import (texts, tiny_bert_preset, tiny_gpt2_preset, tiny_text_config,
                               write_csv, write_folder, write_jsonl)
from tasks.classification_metrics import MacroF1
from trainer.actions.export import export
from trainer.modes import export as export_mode
from trainer.task import get_task


def formats(tmp_path, fmt, examples):
    """data fields of `examples` written in `fmt`: the first 80% train, the rest eval."""
    cut = len(examples) * 4 // 5
    tmp_path.mkdir(parents=True, exist_ok=True)
    write = {"folder": lambda name, part: write_folder(tmp_path / name, part),
             "jsonl": lambda name, part: write_jsonl(tmp_path / f"{name}.jsonl", part),
             "csv": lambda name, part: write_csv(tmp_path / f"{name}.csv", part)}[fmt]
    return dict(format=fmt, train=write("train", examples[:cut]),
                eval=write("eval", examples[cut:]))


def tensorboard_texts(workdir, run):
    out = {}
    for path in tf.io.gfile.glob(f"{workdir}/{run}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "text":
                    out[v.tag] = tf.make_ndarray(v.tensor).item().decode()
    return out


def test_a_folder_of_texts_trains_and_evaluates_with_macro_f1_and_a_confusion_matrix(
        tmp_path):
    """(JSONL and CSV train in the tests below; tests/data/test_labeled_text.py reads the
    three formats alike.)"""
    config = tiny_text_config(formats(tmp_path, "folder", texts(300)), **{
        "trainer.train_steps": 40, "trainer.eval_every": 40})
    trainer = support.build(config, tmp_path / "run")
    trainer.train()
    summary = json.load(open(tmp_path / "run/summary.json"))
    assert summary["eval"]["num_examples"] == 60
    assert summary["eval"]["accuracy"] > 0.6 and summary["eval"]["macro_f1"] > 0.55
    table = tensorboard_texts(tmp_path / "run", "eval")["confusion_matrix"]
    rows = [line for line in table.splitlines() if line.startswith("| **")]
    assert [r.split("**")[1] for r in rows] == ["cooking", "sports", "weather"]
    assert sum(int(n) for r in rows for n in r.split("|")[2:-1]) == 60
    assert json.load(open(tmp_path / "run/task.json"))["label_names"] == [
        "cooking", "sports", "weather"]


def test_macro_f1_is_scikit_learns_over_two_replicas():
    from sklearn.metrics import f1_score
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 64)  # class 4 never a label, and rarely predicted
    logits = rng.normal(size=(64, 5)).astype(np.float32)
    strategy = two_replicas()
    with strategy.scope():
        metric = MacroF1(5)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((labels, logits)).batch(16))
    for y, x in dataset:
        strategy.run(metric.update_state, args=(y, x))
    assert float(metric.result()) == pytest.approx(
        f1_score(labels, logits.argmax(-1), average="macro"), abs=1e-6)


def test_resume_is_exact(tmp_path):
    """Back to the step-10 checkpoint, 10 more steps: bitwise the weights of step 20."""
    config = tiny_text_config(formats(tmp_path, "jsonl", texts(200)), **{
        "trainer.deterministic": True, "trainer.async_checkpoint": "off"})
    trainer = support.build(config, tmp_path / "run")
    trainer.train(evaluate=False)
    expected = [w.numpy() for w in trainer.model.weights]
    assert trainer.restore(str(tmp_path / "run/checkpoints/ckpt-10"))
    assert int(trainer.step.numpy()) == 10
    trainer.train_loop(iter(trainer.distributed_dataset("train")), tf.constant(10, tf.int64))
    assert int(trainer.step.numpy()) == 20
    for a, b in zip(expected, trainer.model.weights):
        np.testing.assert_array_equal(a, b.numpy(), err_msg=b.path)


@pytest.mark.parametrize("topology", [(1, 2), (2, 4)])
def test_each_step_reads_the_examples_of_one_process_on_any_topology(tmp_path, topology):
    task = get_task(tiny_text_config(formats(tmp_path, "jsonl", texts(100))))

    def steps(pipelines, replicas, start, count):
        per_pipeline = [[x["token_ids"] for x, _ in task.build_inputs(
            "train", tf.distribute.InputContext(pipelines, p, replicas), start).take(
                count * replicas // pipelines).as_numpy_iterator()] for p in range(pipelines)]
        stream = [per_pipeline[g % pipelines][g // pipelines] for g in range(count * replicas)]
        return [sorted(map(tuple, np.concatenate(stream[s * replicas:(s + 1) * replicas])))
                for s in range(count)]

    one = steps(1, 1, 0, 6)
    assert one == steps(*topology, 0, 6) and one[4:] == steps(*topology, 4, 2)


def test_two_replicas_train_as_one(tmp_path):
    config = tiny_text_config(formats(tmp_path, "jsonl", texts(100)), **{
        "model.dropout": 0.0, "trainer.train_steps": 4, "trainer.steps_per_loop": 2})
    one = support.build(config, tmp_path / "one")
    one.train(evaluate=False)
    two = support.build(config, tmp_path / "two", two_replicas())
    two.train(evaluate=False)
    for a, b in zip(one.model.weights, two.model.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=a.path)


def served_against_the_model(config, tmp_path, raw):
    """The export's probabilities of `raw` strings, and the model's on the features
    tokenized in Python by the task (as training tokenized its texts)."""
    trainer = support.build(config, tmp_path / "run")
    trainer.train(evaluate=False)
    loaded = tf.saved_model.load(export(config, trainer.task, str(tmp_path / "run")))
    outputs = loaded.signatures["serving_default"](text=tf.constant(raw))
    ids, lengths = trainer.task.text_features.encode_all(raw, "served")
    features = {"token_ids": ids, "padding_mask": tf.sequence_mask(lengths, ids.shape[1])}
    expected = tf.nn.softmax(trainer.model(features, training=False)).numpy()
    return trainer, outputs, expected


@pytest.mark.parametrize("backbone", ["transformer", "bert", "gpt2"])
def test_the_export_takes_raw_strings_and_gives_probabilities_and_label_names(tmp_path,
                                                                              backbone):
    import tensorflow_text  # noqa: F401  (keras_hub's tokenizers' ops, loading the export)
    fields = {"trainer.train_steps": 4, "trainer.checkpoint_every": 4,
              "trainer.steps_per_loop": 2}
    if backbone == "bert":
        fields.update({"model.backbone": tiny_bert_preset(tmp_path / "bert"),
                       "model.pool": "first", "model.seq_len": 32})
    if backbone == "gpt2":  # in float16 too: the preset was saved in float32
        fields.update({"model.backbone": tiny_gpt2_preset(tmp_path / "gpt2"),
                       "model.pool": "last", "model.seq_len": 64,
                       "precision": "mixed_float16", "loss_scale.initial_scale": 2.0**8})
    config = tiny_text_config(formats(tmp_path, "csv", texts(100)), **fields)
    raw = ["rain and snow today", b"caf\xe9 goal".decode("latin-1"), "", "bake " * 80,
           b"\xff\xfe sugar"]
    trainer, outputs, expected = served_against_the_model(config, tmp_path, raw)
    if backbone == "gpt2":  # built in the run's policy, though saved in float32
        block = trainer.model.backbone.get_layer("transformer_layer_0")
        assert block.compute_dtype == "float16" and block.variable_dtype == "float32"
        assert int(trainer.loss_scale.skipped_steps.numpy()) == 0
    if backbone == "transformer":  # bytes: the separator, then the text's bytes, cut
        ids, lengths = trainer.task.text_features.encode_all(raw, "served")
        for text, row, length in zip(raw, ids, lengths):
            data = text if isinstance(text, bytes) else text.encode()
            assert list(row[:length]) == [256, *data[:config.model.seq_len - 1]]
    # (served in float32; the float16 model's own outputs differ by its rounding)
    tolerance = 5e-3 if backbone == "gpt2" else 1e-5
    np.testing.assert_allclose(outputs["probabilities"], expected, rtol=1e-4, atol=tolerance)
    names = [n.decode() for n in outputs["label_names"][0].numpy()]
    assert names == ["cooking", "sports", "weather"]
    # The served label is its own probabilities' argmax (against the float16 model's,
    # a near tie after 4 steps could go either way within the tolerance above).
    assert [n.decode() for n in outputs["label"].numpy()] == [
        names[i] for i in np.asarray(outputs["probabilities"]).argmax(-1)]
    metadata = json.load(open(tmp_path / "run/export/4/assets.extra/export.json"))
    assert metadata["settings"]["label_names"] == names


def test_a_classifier_starts_from_a_language_models_checkpoint(tmp_path):
    sizes = dict(seq_len=32, num_layers=1, d_model=32, num_heads=2, mlp_dim=64)
    lm = tiny_lm(tmp_path / "lm", **{f"model.{k}": v for k, v in sizes.items()},
                 **{"trainer.train_steps": 4, "trainer.steps_per_loop": 2,
                    "optimizer.warmup_steps": 1, "trainer.checkpoint_every": 4})
    lm_trainer = support.build(lm, tmp_path / "lm/run")
    lm_trainer.train(evaluate=False)
    data = formats(tmp_path, "jsonl", texts(100))
    config = tiny_text_config(data, **{f"model.{k}": v for k, v in sizes.items()}, **{
        "init.checkpoint": str(tmp_path / "lm/run"), "trainer.train_steps": 5})
    classifier = support.build(config, tmp_path / "run")
    classifier.train(evaluate=False)
    record = json.load(open(tmp_path / "run/init.json"))
    assert len(record["loaded"]) == 20  # every LM weight, no rename written
    assert all(block.causal for block in classifier.model.blocks)  # the LM's attention
    started = support.build(config, tmp_path / "fresh")
    started.restore_or_warm_start()
    for source, loaded in zip(lm_trainer.model.weights, started.model.weights):
        np.testing.assert_array_equal(source.numpy(), loaded.numpy(), err_msg=loaded.path)
    assert record["left_at_init"] == ["classifier/classifier_head/kernel",
                                      "classifier/classifier_head/bias"]
    # Then from the classifier: the head loads too (init.new holds it only if absent).
    again = support.build(tiny_text_config(data, **{f"model.{k}": v for k, v in sizes.items()},
                                           **{"init.checkpoint": str(tmp_path / "run")}),
                          tmp_path / "again")
    again.restore_or_warm_start()
    assert json.load(open(tmp_path / "again/init.json"))["left_at_init"] == []
    np.testing.assert_array_equal(again.model.head.kernel.numpy(),
                                  classifier.model.head.kernel.numpy())
    # A classifier of other labels (as many): its head would mean other classes.
    relabeled = [(t, label.upper()) for t, label in texts(100)]
    other = support.build(tiny_text_config(
        formats(tmp_path / "other", "jsonl", relabeled),
        **{f"model.{k}": v for k, v in sizes.items()},
        **{"init.checkpoint": str(tmp_path / "run")}), tmp_path / "other_run")
    other.restore_or_warm_start()
    record = json.load(open(tmp_path / "other_run/init.json"))
    assert record["left_at_init"] == ["classifier/classifier_head/kernel",
                                      "classifier/classifier_head/bias"]
    assert "label_names differ" in record["weights"]


def test_a_classifier_of_a_sentencepiece_lm_uses_its_vocabulary(tmp_path):
    """The vocabulary trained when the LM's shards were prepared: its ids are what the
    embeddings mean, so another one with as many pieces would load silently wrong."""
    lm = tiny_lm(tmp_path / "lm", prose(20_000), **{
        "tokenizer.kind": "sentencepiece", "tokenizer.vocab_size": 300,
        "trainer.train_steps": 2, "trainer.steps_per_loop": 2, "optimizer.warmup_steps": 1,
        "model.seq_len": 48})
    lm_trainer = support.build(lm, tmp_path / "lm/run")
    lm_trainer.train(evaluate=False)
    config = tiny_text_config(formats(tmp_path, "jsonl", texts(100)), **{
        "init.checkpoint": str(tmp_path / "lm/run"), "tokenizer.kind": "bytes"})
    task = get_task(config)
    identity = dict(task.text_features.identity)
    assert identity.pop("sha256") == hashlib.sha256(
        lm_trainer.task.tokenizer.model_proto).hexdigest()[:16]
    assert identity == lm_trainer.task.tokenizer.identity
    config.tokenizer.model = str(tmp_path / "another.model")
    with pytest.raises(ValueError, match="is a language model trained with .*tokenizer.model"):
        get_task(config).text_features


def test_a_resume_on_other_labels_is_refused_and_changes_nothing(tmp_path):
    examples = texts(100)
    config = tiny_text_config(formats(tmp_path / "a", "jsonl", examples),
                              **{"trainer.train_steps": 10})
    support.build(config, tmp_path / "run").train(evaluate=False)
    relabeled = [(t, "other" if label == "sports" else label) for t, label in examples]
    config = tiny_text_config(formats(tmp_path / "b", "jsonl", relabeled))
    trainer = support.build(config, tmp_path / "run")
    with pytest.raises(ValueError, match=r"label_names differ .* \"other\""):
        trainer.train(evaluate=False)
    with pytest.raises(ValueError, match=r"ckpt-10 was trained on data whose label_names"):
        export_mode.run(config, tf.distribute.get_strategy(), str(tmp_path / "run"), {})
    assert support.checkpoint_steps(tmp_path / "run/checkpoints") == [10]
    assert "sports" in open(tmp_path / "run/task.json").read()
