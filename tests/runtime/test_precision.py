"""Per-layer float32 overrides and the shape advisor."""

import json
import re

import keras
import pytest
import tensorflow as tf

from support import build, tiny_config, two_replicas
from support.lm import tiny_lm_config
from support.two_heads import TwoHeads
from trainer import Trainer
from trainer.modes.precision_check import precision_check
from trainer.runtime.precision import advise_shapes, layers_of, misaligned_shapes, set_policy


@pytest.mark.parametrize("make_config,pattern,expected_classes", [
    (tiny_config, ".*conv2d.*", {"Conv2D"}),
    # a container: its sublayers follow (the projections, and the path-less softmax)
    (tiny_lm_config, r".*/multi_head_attention(_\d+)?", {"MultiHeadAttention", "EinsumDense"}),
])
def test_float32_layers_change_exactly_the_matching_layers(tmp_path, make_config, pattern,
                                                           expected_classes):
    baseline = build(make_config(precision="mixed_bfloat16", **{"trainer.train_steps": 2}),
                     tmp_path / "a")
    config = make_config(precision="mixed_bfloat16", **{"trainer.train_steps": 2})
    config.precision_overrides.float32_layers = (pattern,)
    overridden = build(config, tmp_path / "b")
    before, after = layers_of(baseline.model), layers_of(overridden.model)
    assert [type(l) for l in before] == [type(l) for l in after]
    changed = [a for b, a in zip(before, after) if a.compute_dtype != b.compute_dtype]
    assert {type(l).__name__ for l in changed} == expected_classes
    for b, a in zip(before, after):  # the matching layers and their sublayers, only they
        matches = bool(re.fullmatch(f"(?:{pattern})(?:/.*)?", a.path))
        assert a.compute_dtype == ("float32" if matches else b.compute_dtype), a.path
    assert overridden.policy == "mixed_bfloat16"
    for layer in after:  # path-less sublayers (softmax, dropout) follow their parent
        for child in layer._flatten_layers(include_self=False, recursive=False):
            if not child.path:
                assert child.compute_dtype == layer.compute_dtype, (layer.path, child)
    # The same variables either way: a checkpoint of one restores into the other.
    overridden.train(evaluate=False)
    restored = build(make_config(precision="mixed_bfloat16"), tmp_path / "b")
    assert restored.restore()
    assert int(restored.step.numpy()) == int(overridden.step.numpy()) > 0


@pytest.mark.parametrize("pattern,match", [
    ("layer_norm", r"'layer_norm' matches no layer path.*Some paths of this model: seed_cnn"),
    ("conv2d[", r"'conv2d\[' is not a regular expression"),
])
def test_a_bad_float32_layers_pattern_is_a_clear_error(tmp_path, pattern, match):
    config = tiny_config(precision="mixed_bfloat16")
    config.precision_overrides.float32_layers = (".*conv2d.*", pattern)
    with pytest.raises(ValueError, match=match):
        build(config, tmp_path)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_the_advisor_names_exactly_the_misaligned_layers():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(16, 3, name="conv_ok")(inputs)       # 3 input channels: fine
    x = keras.layers.Conv2D(12, 3, name="conv_odd")(x)           # 12 filters
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(32, name="dense_ok")(x)               # 576 in, 32 out
    x = keras.layers.Dense(20, name="dense_odd")(x)              # 20 out
    x = keras.layers.Conv2DTranspose(12, 3, name="up_odd")(keras.layers.Reshape((4, 5, 1))(x))
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(10, dtype="float32", name="head")(x)  # float32: not judged
    model = keras.Model(inputs, outputs)
    found = {path: odd for path, _, odd in misaligned_shapes(model, 8)}
    assert found == {"conv_odd": {"filters": (12, 16)}, "dense_odd": {"out": (20, 24)},
                     "up_odd": {"filters": (12, 16)}}
    batch = advise_shapes(model, {"per-replica batch": 12}, tf.distribute.get_strategy())
    assert ("per-replica batch", "", {"size": (12, 16)}) in batch
    assert [p for p, _, _ in misaligned_shapes(model, 128)] == [
        "conv_ok", "conv_odd", "dense_ok", "dense_odd", "up_odd"]  # a TPU wants 128
    keras.mixed_precision.set_global_policy("float32")
    assert advise_shapes(model, {"per-replica batch": 12}, tf.distribute.get_strategy()) == []


@pytest.mark.parametrize("factor,verdict", [(1e-12, "change"), (1.0, "ok")])
def test_the_check_flags_a_branch_that_underflows_in_float16(tmp_path, factor, verdict):
    config = tiny_config(precision="mixed_float16", **{"numerics.check_steps": 3,
                                                       "optimizer.learning_rate": 1e-2})
    report = precision_check(config, tf.distribute.get_strategy(), str(tmp_path),
                             lambda c: TwoHeads(c, factor))
    assert report["verdict"] == verdict, report["advice"]
    saved = json.load(open(tmp_path / "precision_check.json"))
    assert saved["verdict"] == verdict and len(saved["loss"]["float32"]) == 3
    rows = report["layers"]["step 0"]
    assert set(rows) == {"hidden", "main", "branch"}
    if verdict == "change":
        assert rows["branch"]["underflow"] == 1.0
        assert rows["main"]["underflow"] == 0.0
        assert """float32_layers='["branch"]'""" in report["advice"][0]
        # and the advice works: with that layer in float32 the verdict is ok
        config.precision_overrides.float32_layers = ("branch",)
        fixed = precision_check(config, tf.distribute.get_strategy(), str(tmp_path),
                                lambda c: TwoHeads(c, factor))
        assert fixed["verdict"] == "ok", fixed["advice"]
    for layer in ("hidden", "main"):  # float16's headroom is reported
        assert rows[layer]["headroom_low_bits"] > 0 and rows[layer]["headroom_high_bits"] > 0


def node_names(trainer):
    """Every op name in the traced train loop, its loop bodies and branches included."""
    iterator = iter(trainer.distributed_dataset("train"))
    graph = trainer.train_loop.get_concrete_function(
        iterator, tf.constant(1, tf.int64)).graph.as_graph_def()
    return [n.name for n in graph.node] + [
        n.name for f in graph.library.function for n in f.node_def]


def test_telemetry_off_traces_nothing_into_the_step(tmp_path):
    off = node_names(build(tiny_config(**{"numerics.every": 0}), tmp_path / "off"))
    on = node_names(build(tiny_config(**{"numerics.every": 5}), tmp_path / "on"))
    assert not [n for n in off if "numerics" in n]
    assert [n for n in on if "numerics" in n]
    assert len(on) > len(off)


def events(workdir, run):
    """{tag: plugin name} of the summaries in the event files."""
    return {v.tag: v.metadata.plugin_data.plugin_name
            for path in tf.io.gfile.glob(str(workdir / run / "events.*"))
            for e in tf.compat.v1.train.summary_iterator(path) for v in e.summary.value}


def train_two_heads(tmp_path, factor, strategy, steps=3, accumulation_steps=1):
    config = tiny_config(precision="mixed_float16", **{
        "numerics.every": 1, "trainer.train_steps": steps, "trainer.steps_per_loop": steps,
        "trainer.best_metric": "", "optimizer.learning_rate": 1e-2,
        "trainer.accumulation_steps": accumulation_steps})
    set_policy(config.precision, strategy)
    with strategy.scope():
        trainer = Trainer(config, TwoHeads(config, factor), strategy, str(tmp_path))
    trainer.train(evaluate=False)
    return json.load(open(tmp_path / "numerics.json"))


def test_telemetry_flags_the_branch_that_underflows_in_float16(tmp_path):
    """On 2 replicas, accumulating 2 micro-batches (activations of the first one)."""
    report = train_two_heads(tmp_path, 1e-12, two_replicas(), accumulation_steps=2)
    assert list(report["at_risk"]) == ["branch"]
    assert "100% of gradient entries are zero" in report["at_risk"]["branch"][0]
    assert """float32_layers='["branch"]'""" in report["advice"][0]
    assert report["layers"]["main"]["headroom_low_bits"] > 2  # measured, and healthy
    # the branch's float16 outputs are all zero; the ReLU layer's partly
    assert report["layers"]["branch"]["activation_zero_fraction"] == 1.0
    assert 0 < report["layers"]["hidden"]["activation_zero_fraction"] < 1
    assert report["layers"]["hidden"]["activation_max_abs"] > 0
    tags = events(tmp_path, "train")
    assert {"numerics/grad_norm/main/kernel", "numerics/grad_zero_fraction/branch/kernel",
            "numerics/headroom_low_bits/main", "numerics/activation_max_abs/hidden"} <= set(tags)
    assert tags["numerics/scaled_grad_log2/main"] == "histograms"


def test_telemetry_flags_activations_that_overflow_float16(tmp_path):
    report = train_two_heads(tmp_path, 1e6, tf.distribute.get_strategy(), steps=2)
    assert list(report["at_risk"]) == ["branch"]
    assert "of outputs inf/NaN" in " ".join(report["at_risk"]["branch"])
    assert report["layers"]["main"]["activation_nonfinite_fraction"] == 0


def test_telemetry_watches_every_layer_of_the_lm(tmp_path):
    config = tiny_lm_config("float32", **{"numerics.every": 2, "trainer.best_metric": ""})
    trainer = build(config, tmp_path)
    trainer.train(evaluate=False)
    layers = json.load(open(tmp_path / "numerics.json"))["layers"]
    called = {layer.path for layer in layers_of(trainer.model)}
    assert called - set(layers) == set(), "layers without activation statistics"
    for path, stats in layers.items():
        assert stats["activation_nonfinite_fraction"] == 0, path
