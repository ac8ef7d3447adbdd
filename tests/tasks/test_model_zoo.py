"""Models as users bring them (tests/support/zoo.py), on 2 replicas under mixed_bfloat16: each
trains, resumes bitwise, exports and serves, and refuses a checkpoint of a variant."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import support
from support import build, two_replicas, zoo  # (zoo registers its task)
from trainer.actions.export import export
from trainer.runtime.precision import layers_of
from trainer.state.model_build import build_model
from trainer.state.checkpoints import IncompatibleCheckpointError


def state(trainer):
    """Every checkpointed value of the run, by name: model and optimizer."""
    return {f"{node}:{name}": v.numpy() for node, named in trainer.checkpoints.named.items()
            for name, v in named.items() if not name.endswith("seed_generator_state")}


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_a_model_trains_resumes_exports_and_refuses_its_variant(tmp_path, name, caplog):
    caplog.set_level("INFO")
    strategy = two_replicas()
    config = zoo.zoo_config(name, precision="mixed_bfloat16")
    whole = build(config, tmp_path / "whole", strategy)
    whole.train(evaluate=True)
    assert int(whole.step.numpy()) == 4

    # Back to the step-2 checkpoint, 2 more steps: bitwise the same at step 4. (A fresh
    # build of the model reads the checkpoints below: the export and the variant.)
    expected = state(whole)
    assert whole.restore(str(tmp_path / "whole" / "checkpoints" / "ckpt-2"))
    assert int(whole.step.numpy()) == 2
    whole.train_loop(iter(whole.distributed_dataset("train")), tf.constant(2, tf.int64))
    got = state(whole)
    assert expected.keys() == got.keys() and len(got) > 4
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)

    if name == "aux_head":  # its aux head gets no gradient: named once, left as built
        assert any("get no gradient" in r.getMessage() and "aux/kernel" in r.getMessage()
                   for r in caplog.records)
    if name == "counter":  # 4 steps x 4 examples per replica, the same on both replicas
        counter = whole.model.get_layer("counter")
        counts = [int(c) for c in strategy.experimental_local_results(counter.count.value)]
        assert counts == [16, 16] and bool(counter.seen.numpy())
    if name == "frozen_backbone":  # constants: not averaged over replicas at every step
        assert not whole.variables.averaged and not whole.variables.from_first_replica
    if name == "lists":  # the BN statistics of the dict-held norms are in the checkpoint
        assert any("norms" not in n and "moving_mean" in n
                   for n in whole.checkpoints.named["model"])

    # Served in float32: the float32 outputs of the step-4 weights, to within float
    # rounding (the step-2 weights' outputs differ far more: checked below).
    directory = export(config, whole.task, str(tmp_path / "whole"))
    served, float32_outputs = _served_and_float32(directory, whole)
    trained = float32_outputs(whole.model.get_weights())
    np.testing.assert_allclose(served, trained, atol=1e-5, rtol=1e-5)
    assert whole.restore(str(tmp_path / "whole" / "checkpoints" / "ckpt-2"))
    older = float32_outputs(whole.model.get_weights())
    assert np.abs(older - trained).max() > 1e-3  # the tolerance above tells them apart

    variant = build(zoo.zoo_config(name, precision="mixed_bfloat16", **{"model.variant": 1}),
                    tmp_path / "whole", strategy)
    before = state(variant)
    with pytest.raises(IncompatibleCheckpointError, match=r"does not fit this run"):
        variant.restore()
    after = state(variant)  # nothing changed before the refusal
    assert before.keys() == after.keys()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def _served_and_float32(directory, trainer):
    """The export's first output on one eval batch, and a function of weights to a
    float32 model's first output on it."""
    serve = tf.saved_model.load(directory).signatures["serving_default"]
    features, _ = next(iter(trainer.task.build_inputs("eval", tf.distribute.InputContext(), 0)))
    served = serve(**(features if isinstance(features, dict) else {"image": features}))
    keras.mixed_precision.set_global_policy("float32")
    try:
        model = build_model(trainer.task)
    finally:
        keras.mixed_precision.set_global_policy(trainer.policy)

    def float32_outputs(weights):
        model.set_weights(weights)
        outputs = model(features, training=False)
        return (outputs[0] if isinstance(outputs, list) else outputs).numpy()

    return served["output_0" if "output_0" in served else "logits"].numpy(), float32_outputs


def test_nested_inputs_and_outputs_in_precision_check_and_telemetry(tmp_path):
    """Dict inputs, an unused aux output (no gradient): the precision check compares the
    trained layers, telemetry records every layer."""
    from trainer.task import get_task
    from trainer.modes.precision_check import precision_check

    for name in ("dict_inputs", "aux_head"):
        config = zoo.zoo_config(name, precision="mixed_bfloat16",
                                **{"numerics.check_steps": 2})
        report = precision_check(config, tf.distribute.get_strategy(),
                                 str(tmp_path / name), get_task)
        assert len(report["loss"]["float32"]) == 2 and report["layers"]["step 2"]
        assert not any(layer.startswith("aux") for layer in report["layers"]["step 2"])
    trainer = build(zoo.zoo_config("dict_inputs", **{"numerics.every": 1,
                                                     "trainer.train_steps": 2}),
                    tmp_path / "telemetry")
    trainer.train(evaluate=False)
    report = json.load(open(tmp_path / "telemetry" / "numerics.json"))
    assert report["step"] == 2
    called = {layer.path for layer in layers_of(trainer.model) if layer.variables}
    assert called and called <= set(report["layers"]), "layers without statistics"
    for layer in called:  # the dense layers' gradients and outputs were measured
        stats = report["layers"][layer]
        assert 0 <= stats["grad_zero_fraction"] < 1 and stats["activation_max_abs"] > 0, layer
        assert stats["activation_nonfinite_fraction"] == 0, layer



@pytest.mark.parametrize("name", [  # unnamed_weights relaunches in a process of its own
    pytest.param("unnamed_weights", marks=pytest.mark.e2e), "bidirectional"])
def test_auto_named_weights_have_one_name_in_every_build(tmp_path, name):
    """Unnamed add_weight (`variable_N`), a weight named like its layer, a wrapper's
    copies (`forward_gru_1`): the end-of-training export, a warm start from the model's
    own .weights.h5 and a relaunch in a fresh process all find every variable."""
    run = tmp_path / "run"
    trainer = build(zoo.zoo_config(name, **{"export.enabled": True}), run)
    trainer.train(evaluate=False)
    assert json.load(open(run / "summary.json"))["stopped"] is None
    assert (run / "export" / "4" / "saved_model.pb").exists()

    weights = str(tmp_path / "model.weights.h5")
    trainer.model.save_weights(weights)
    warm = build(zoo.zoo_config(name, **{"init.checkpoint": weights}), tmp_path / "warm")
    warm.restore_or_warm_start()
    record = json.load(open(tmp_path / "warm" / "init.json"))
    assert record["left_at_init"] == [] and sorted(record["loaded"]) == sorted(
        n for n in trainer.variable_names if not n.endswith("seed_generator_state"))
    for a, b in zip(warm.model.weights, trainer.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)

    if name != "unnamed_weights":  # the guide's layers: a relaunch in a fresh process too
        return
    relaunch = subprocess.run([sys.executable, "-c", (
        "import sys; sys.path.insert(0, sys.argv[1]); from support import build, zoo;"
        "t = build(zoo.zoo_config(sys.argv[2], **{'trainer.train_steps': 6}), sys.argv[3]);"
        "print('restored', t.restore(), sorted(t.variable_names))"),
        os.path.join(support.ROOT, "tests"), name, str(run)], capture_output=True, text=True)
    assert relaunch.returncode == 0, relaunch.stderr[-2000:]
    assert f"restored {run / 'checkpoints' / 'ckpt-4'} {sorted(trainer.variable_names)}" \
        in relaunch.stdout


class _NeedsAMask(keras.Model):
    """A subclassed model that cannot be called on the features alone."""

    def __init__(self):
        super().__init__()
        self.head = keras.layers.Dense(zoo.CLASSES)

    def call(self, x, mask):
        return self.head(x) * mask


def test_a_model_no_batch_can_build_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(zoo.MODELS, "needs_a_mask", lambda variant: _NeedsAMask())
    with pytest.raises(ValueError, match=r"Zoo.build_model\(\) returned an unbuilt model .*"
                                         r"building it on the train features' shapes failed "
                                         r"\(TypeError: .*mask.*Build it in build_model\(\)"):
        build(zoo.zoo_config("needs_a_mask"), tmp_path)
