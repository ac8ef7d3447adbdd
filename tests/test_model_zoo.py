"""Models as users bring them (tests/zoo.py), on 2 replicas under mixed_bfloat16: each
trains, resumes bitwise, exports and serves, and refuses a checkpoint of a variant."""

import numpy as np
import pytest
import tensorflow as tf

import zoo  # noqa: F401  (registers the task)
from conftest import build, two_replicas
from trainer.outputs.export import export
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

    directory = export(config, whole.task, str(tmp_path / "whole"))
    serve = tf.saved_model.load(directory).signatures["serving_default"]
    features, _ = next(iter(whole.task.build_inputs("eval", tf.distribute.InputContext(), 0)))
    inputs = features if isinstance(features, dict) else {"image": features}
    served = serve(**inputs)
    outputs = whole.model(features, training=False)
    first = outputs[0] if isinstance(outputs, list) else outputs
    key = "output_0" if isinstance(outputs, list) else "logits"
    np.testing.assert_allclose(served[key].numpy(), tf.cast(first, tf.float32).numpy(),
                               atol=0.1)  # served in float32, trained in bfloat16

    variant = build(zoo.zoo_config(name, precision="mixed_bfloat16", **{"model.variant": 1}),
                    tmp_path / "whole", strategy)
    with pytest.raises(IncompatibleCheckpointError, match=r"does not fit this run"):
        variant.restore()
    np.testing.assert_array_equal(  # nothing changed before the refusal
        variant.step.numpy(), 0)


def test_nested_inputs_and_outputs_in_precision_check_and_telemetry(tmp_path):
    """Dict inputs, an unused aux output (no gradient): the precision check compares the
    trained layers, telemetry records every layer."""
    import tasks
    from trainer.modes.precision_check import precision_check

    for name in ("dict_inputs", "aux_head"):
        config = zoo.zoo_config(name, precision="mixed_bfloat16",
                                **{"numerics.check_steps": 2})
        report = precision_check(config, tf.distribute.get_strategy(),
                                 str(tmp_path / name), tasks.get_task)
        assert len(report["loss"]["float32"]) == 2 and report["layers"]["step 2"]
        assert not any(layer.startswith("aux") for layer in report["layers"]["step 2"])
    trainer = build(zoo.zoo_config("dict_inputs", **{"numerics.every": 1,
                                                     "trainer.train_steps": 2}),
                    tmp_path / "telemetry")
    trainer.train(evaluate=False)
    assert (tmp_path / "telemetry" / "numerics.json").exists()
