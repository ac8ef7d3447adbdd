"""Strict restore (every value lands, every variable gets one), warm start from another
run or a Keras file (`config.init`), frozen variables, weight decay exclusions."""

import json
import re
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from support import build, tiny_config, zoo  # (zoo registers its task)
from support.lm import tiny_lm
from trainer import Trainer
from trainer.actions.export import choose_checkpoint
from trainer.state.checkpoints import IncompatibleCheckpointError


def weights(trainer):
    """Every model variable's value, in the model's order."""
    return [v.numpy() for v in trainer.model.variables]


def lm(tmp_path, **overrides):
    """A 2-block LM that checkpoints at step 4."""
    return tiny_lm(tmp_path, **{"model.num_layers": 2, "optimizer.warmup_steps": 0,
                                "trainer.checkpoint_every": 4, **overrides})


def test_an_unchanged_lm_relaunch_continues(tmp_path):
    config = lm(tmp_path, **{"trainer.train_steps": 4})
    build(config, tmp_path / "run").train(evaluate=False)
    again = build(lm(tmp_path, **{"trainer.train_steps": 6}), tmp_path / "run")
    assert again.restore().endswith("ckpt-4") and int(again.step.numpy()) == 4


@pytest.mark.parametrize("first, change, missing, unexpected, mismatched", [
    # (the final LayerNorm is the model's third, not its fifth: another name)
    ({}, {"model.num_layers": 1}, r"lm/layer_normalization_2/gamma \[32\]",
     r"lm/block_1/dense_\d/kernel \[32, 64\]", None),
    ({"model.tie_embeddings": False}, {}, None, r"lm/dense_\d/kernel \[32, 257\]", None),
    ({}, {"model.mlp_dim": 32}, None, None,
     r"lm/block/dense/kernel: checkpoint \[32, 64\] float32, this run \[32, 32\]"),
])
def test_a_changed_lm_is_refused_naming_the_variables(tmp_path, first, change, missing,
                                                      unexpected, mismatched):
    build(lm(tmp_path, **{"trainer.train_steps": 4, **first}), tmp_path / "run").train(
        evaluate=False)
    changed = build(lm(tmp_path, **{"trainer.train_steps": 6, **change}), tmp_path / "run")
    before = weights(changed)
    with pytest.raises(IncompatibleCheckpointError) as e:
        changed.restore()
    message = str(e.value)
    assert "ckpt-4 does not fit this run" in message and "Nothing was changed" in message
    for kind, pattern in (("missing", missing), ("unexpected", unexpected),
                          ("mismatched", mismatched)):
        listed = re.search(rf"\n  {kind} \(\d+\): (.*)", message)
        assert bool(listed) == bool(pattern), message
        if pattern:
            assert re.search(pattern, listed.group(1)), message
    for value, old in zip(weights(changed), before):  # nothing changed
        np.testing.assert_array_equal(value, old)
    assert int(changed.step.numpy()) == 0


def test_turning_the_ema_off_on_resume_names_the_ema(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 2, "trainer.checkpoint_every": 2,
                            "optimizer.ema_decay": 0.9})
    build(config, tmp_path).train(evaluate=False)
    without = build(tiny_config(**{"trainer.train_steps": 4}), tmp_path)
    with pytest.raises(IncompatibleCheckpointError, match=r"holds an EMA of the weights.*"
                                                          r"optimizer.ema_decay"):
        without.restore()


def test_export_in_best_mode_without_a_best_checkpoint_takes_the_latest(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 2, "trainer.checkpoint_every": 2})
    build(config, tmp_path).train(evaluate=False)
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "best.json").write_text(json.dumps(
        {"metric": "eval/accuracy", "mode": "max", "value": None, "step": None,
         "checkpoint": None}))  # every evaluation so far was not finite
    assert choose_checkpoint(config, str(tmp_path)).endswith("checkpoints/ckpt-2")


# ----------------------------------------------------------------- warm start

def zoo_run(name, tmp_path, workdir, **overrides):
    return build(zoo.zoo_config(name, **{"trainer.train_steps": 5, **overrides}),
                 tmp_path / workdir)


def test_init_from_a_keras_weights_file(tmp_path):
    """A .weights.h5 a plain Keras model wrote (no Trainer) seeds step 0."""
    source = zoo.MODELS["lists"](0)
    for v in source.trainable_variables:
        v.assign(tf.fill(v.shape, 0.25))
    source.save_weights(str(tmp_path / "plain.weights.h5"))
    trainer = zoo_run("lists", tmp_path, "run", **{"init.checkpoint": str(
        tmp_path / "plain.weights.h5")})
    trainer.restore_or_warm_start()
    for name, v in trainer.variable_names.items():
        if v.trainable:
            assert np.all(v.numpy() == 0.25), name
    record = json.load(open(tmp_path / "run" / "init.json"))
    assert len(record["loaded"]) == len(trainer.variable_names) and not record["left_at_init"]


def test_init_from_another_run_with_another_head_excluded(tmp_path):
    source = zoo_run("frozen_backbone", tmp_path, "source")
    source.train(evaluate=False)
    overrides = {"model.variant": 1, "init.checkpoint": str(tmp_path / "source")}
    with pytest.raises(ValueError, match=r"other shape \(2\): dense/kernel: source \[8, 4\], "
                                         r"this model \[8, 5\]"):
        zoo_run("frozen_backbone", tmp_path, "strict", **overrides).restore_or_warm_start()
    assert not (tmp_path / "strict" / "init.json").exists()
    tuned = zoo_run("frozen_backbone", tmp_path, "tuned", **overrides,
                    **{"init.exclude": ("dense/.*",)})
    head = tuned.variable_names["dense/kernel"].numpy()
    tuned.restore_or_warm_start()
    for name, v in tuned.variable_names.items():
        if name.startswith("backbone/"):
            np.testing.assert_array_equal(v.numpy(), source.variable_names[name].numpy(), name)
    np.testing.assert_array_equal(tuned.variable_names["dense/kernel"].numpy(), head)
    record = json.load(open(tmp_path / "tuned" / "init.json"))
    assert record["left_at_init"] == ["dense/kernel", "dense/bias"]
    assert record["skipped"] == ["dense/bias", "dense/kernel"]  # in the source, not loaded


def test_init_renames_a_backbones_paths(tmp_path):
    """A .keras backbone saved under other layer names, mapped by init.rename."""
    inputs = keras.Input((zoo.SIZE, zoo.SIZE, 3))
    conv = keras.layers.Conv2D(8, 3, name="stem")
    other = keras.Model(inputs, keras.layers.BatchNormalization(name="stem_bn")(conv(inputs)))
    for v in other.weights:
        v.assign(tf.random.normal(v.shape, seed=1) if v.trainable else tf.fill(v.shape, 2.0))
    other.save(str(tmp_path / "other.keras"))
    trainer = zoo_run("frozen_backbone", tmp_path, "run", **{
        "init.checkpoint": str(tmp_path / "other.keras"), "init.include": ("backbone/.*",),
        "init.keras_architecture": True, "init.rename": (("^stem_bn/", "backbone/batch_normalization/"),
                        ("^stem/", "backbone/conv2d/"))})
    trainer.restore_or_warm_start()
    np.testing.assert_array_equal(trainer.variable_names["backbone/conv2d/kernel"].numpy(),
                                  conv.kernel.numpy())
    np.testing.assert_array_equal(
        trainer.variable_names["backbone/batch_normalization/moving_variance"].numpy(), 2.0)


@keras.saving.register_keras_serializable("tests")
class Deserialized(keras.layers.Layer):
    """Leaves a file behind when Keras builds it from a config, as hostile code would."""

    marker = None

    @classmethod
    def from_config(cls, config):
        open(cls.marker, "w").close()
        return cls()


def test_a_keras_file_gives_its_weights_and_never_builds_its_architecture(tmp_path,
                                                                          monkeypatch):
    source = build(tiny_config(), tmp_path / "source")
    path = tmp_path / "model.keras"
    source.model.save(str(path))
    # Its config.json now names a class whose construction runs code.
    with zipfile.ZipFile(path) as z:
        files = {n: z.read(n) for n in z.namelist()}
    files["config.json"] = json.dumps({"module": None, "class_name": "Deserialized",
                                       "registered_name": "tests>Deserialized",
                                       "config": {}}).encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    monkeypatch.setattr(Deserialized, "marker", str(tmp_path / "built"))
    tuned = build(tiny_config(**{"init.checkpoint": str(path)}), tmp_path / "tuned")
    record = tuned.warm_start()
    assert not (tmp_path / "built").exists()
    assert record["weights"] == "the file's weights" and not record["left_at_init"]
    for name, variable in tuned.variable_names.items():
        np.testing.assert_array_equal(variable.numpy(), source.variable_names[name].numpy())


def test_a_frozen_regex_leaves_its_variables_bitwise_unchanged(tmp_path):
    trainer = zoo_run("lists", tmp_path, "run", **{"optimizer.freeze": (".*/dense/.*",)})
    frozen = {n: v.numpy() for n, v in trainer.variable_names.items() if "/dense/" in n}
    assert len(frozen) == 2
    assert not any("/dense/" in n for n in trainer.checkpoints.named["optimizer"])  # no slots
    trainer.train(evaluate=False)
    assert int(trainer.step.numpy()) == 5
    for name, value in frozen.items():
        np.testing.assert_array_equal(trainer.variable_names[name].numpy(), value, name)
    head = trainer.variable_names["blocks_in_lists/dense_2/kernel"]
    assert not np.array_equal(head.numpy(), zoo_run("lists", tmp_path, "fresh")
                              .variable_names["blocks_in_lists/dense_2/kernel"].numpy())


def test_init_is_not_reapplied_on_resume(tmp_path):
    source = zoo_run("lists", tmp_path, "source", **{"trainer.train_steps": 2})
    source.train(evaluate=False)
    config = {"init.checkpoint": str(tmp_path / "source"), "trainer.train_steps": 2}
    tuned = zoo_run("lists", tmp_path, "tuned", **config)
    tuned.train(evaluate=False)
    trained = weights(tuned)
    resumed = zoo_run("lists", tmp_path, "tuned", **dict(config, **{"trainer.train_steps": 4}))
    assert resumed.restore_or_warm_start().endswith("ckpt-2")
    for value, expected in zip(weights(resumed), trained):
        np.testing.assert_array_equal(value, expected)


def test_weight_decay_skips_biases_norms_and_embeddings(tmp_path):
    trainer = build(tiny_lm(tmp_path, **{"optimizer.weight_decay": 0.5}), tmp_path / "run")
    decayed = {n for n, v in trainer.variable_names.items()
               if v.trainable and trainer.optimizer._use_weight_decay(v)}
    assert decayed and all(n.endswith("/kernel") for n in decayed), decayed
    assert "lm/embedding/embeddings" not in decayed


def test_a_workdir_of_the_old_layout_is_refused_and_warm_starts_a_new_one(tmp_path):
    """tftrainer 0.1 saved Keras' object graph (list-held layers through the optimizer)."""
    old = zoo_run("lists", tmp_path, "old")
    for v in old.model.trainable_variables:
        v.assign(tf.fill(v.shape, 0.5))
    old.optimizer.build(old.model.trainable_variables)
    tf.train.Checkpoint(model=old.model, optimizer=old.optimizer, step=old.step).write(
        str(tmp_path / "old" / "checkpoints" / "ckpt-3"))
    (tmp_path / "old" / "checkpoints" / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-3"\n')
    resumed = zoo_run("lists", tmp_path, "old")
    with pytest.raises(IncompatibleCheckpointError, match=r"layout 1 of tftrainer 0.1.*"
                                                          r"--config.init.checkpoint="):
        resumed.restore()
    new = zoo_run("lists", tmp_path, "new", **{"init.checkpoint": str(tmp_path / "old")})
    new.restore_or_warm_start()
    for name, v in new.variable_names.items():
        if v.trainable:
            assert np.all(v.numpy() == 0.5), name


def test_a_raw_tf_variable_in_a_layer_is_refused_at_build(tmp_path):
    """Keras 3 does not list a raw tf.Variable in model.variables: no checkpoint would
    hold it, so the run stops before training, naming it."""
    class Raw(keras.layers.Layer):
        def build(self, input_shape):
            self.calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="calls")

        def call(self, x):
            return x

    class Task(zoo.Zoo):
        def build_model(self):
            image = keras.Input((zoo.SIZE, zoo.SIZE, 3))
            pooled = keras.layers.GlobalAveragePooling2D()(Raw()(image))
            return keras.Model(image, keras.layers.Dense(zoo.CLASSES)(pooled))

    config = zoo.zoo_config("aux_head")
    with pytest.raises(ValueError, match=r"1 tf.Variable\(s\) that Keras does not list.*"
                                         r"calls.*self.add_weight"):
        Trainer(config, Task(config), tf.distribute.get_strategy(), str(tmp_path))


def test_init_from_a_workdir_whose_newest_checkpoint_is_damaged_falls_back(tmp_path, caplog):
    source = zoo_run("dict_inputs", tmp_path, "source", **{"trainer.train_steps": 4})
    source.train(evaluate=False)  # ckpt-2 and ckpt-4
    expected = {n: v.numpy() for n, v in source.variable_names.items()}
    source.restore(str(tmp_path / "source" / "checkpoints" / "ckpt-2"))
    at_2 = {n: v.numpy() for n, v in source.variable_names.items()}
    data = next((tmp_path / "source" / "checkpoints").glob("ckpt-4.data-*"))
    data.write_bytes(data.read_bytes()[:100])  # truncated
    caplog.set_level("WARNING")
    tuned = zoo_run("dict_inputs", tmp_path, "tuned",
                    **{"init.checkpoint": str(tmp_path / "source")})
    tuned.restore_or_warm_start()
    assert any("ckpt-4 is unreadable" in r.getMessage() and "previous" in r.getMessage()
               for r in caplog.records)
    for name, v in tuned.variable_names.items():
        if not name.endswith("seed_generator_state"):
            np.testing.assert_array_equal(v.numpy(), at_2[name], err_msg=name)
    assert any((at_2[n] != expected[n]).any() for n in at_2)  # ckpt-2 is not ckpt-4


@pytest.mark.parametrize("use_ema", [True, False])
def test_init_from_a_run_with_an_ema_loads_what_it_evaluated(tmp_path, use_ema):
    """By default the EMA weights (what the source evaluated, kept as best, exported)."""
    source = zoo_run("dict_inputs", tmp_path, "source", **{"optimizer.ema_decay": 0.5})
    source.train(evaluate=False)
    raw = {n: v.numpy() for n, v in source.variable_names.items()}
    with source.eval_weights():
        evaluated = {n: v.numpy() for n, v in source.variable_names.items()}
    tuned = zoo_run("dict_inputs", tmp_path, "tuned", **{
        "init.checkpoint": str(tmp_path / "source"), "init.use_ema": use_ema})
    tuned.restore_or_warm_start()
    expected = evaluated if use_ema else raw
    for name, v in tuned.variable_names.items():
        np.testing.assert_array_equal(v.numpy(), expected[name], err_msg=name)
    assert any((raw[n] != evaluated[n]).any() for n in raw)  # the choice matters here
    record = json.load(open(tmp_path / "tuned" / "init.json"))
    assert record["weights"].startswith("the EMA" if use_ema else "raw weights")
