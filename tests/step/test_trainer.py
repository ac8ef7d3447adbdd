"""End to end on tiny synthetic CIFAR: learning, resume, exact evaluation, summaries."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.data.images.preprocess import normalize
from support import build, scalars, tiny_config, two_replicas


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_training_lowers_the_loss(tmp_path, precision):
    config = tiny_config(precision=precision, **{"trainer.train_steps": 60,
                                                 "trainer.eval_every": 60})
    trainer = build(config, tmp_path)
    first_eval = trainer.evaluate()
    final_eval = trainer.train()
    assert keras.mixed_precision.global_policy().name == precision
    assert final_eval["loss"] < 0.7 * first_eval["loss"]
    assert final_eval["accuracy"] > 0.5  # chance is 0.1
    train = scalars(tmp_path, "train")
    losses = [v for _, v in sorted(train["loss"])]
    assert losses[-1] < losses[0]
    for tag in ("learning_rate", "loss_scale", "grad_norm", "skipped_steps",
                "examples_per_sec", "steps_per_sec", "accuracy"):
        assert tag in train, tag
    assert sorted(s for s, _ in train["loss"]) == list(range(5, 65, 5))
    evals = scalars(tmp_path, "eval")
    assert {"accuracy", "loss"} <= set(evals)
    assert json.load(open(tmp_path / "config.json"))["trainer"]["train_steps"] == 60
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["stopped"] is None and summary["steps"] == summary["steps_this_run"] == 60
    assert summary["eval"] == final_eval and summary["precision"] == precision
    assert summary["train"]["loss"] == losses[-1]
    assert summary["parameters"] == {
        "total": sum(w.numpy().size for w in trainer.model.weights),
        "trainable": sum(w.numpy().size for w in trainer.model.trainable_weights)}
    assert summary["strategy"] == "_DefaultDistributionStrategy" and summary["replicas"] == 1
    assert summary["versions"]["tensorflow"] == tf.__version__
    seconds = summary["seconds"]
    assert seconds["train"] > 0 and seconds["eval"] > 0 and seconds["checkpoint"] > 0
    assert sum(seconds[k] for k in ("train", "eval", "checkpoint", "other")) <= seconds["total"]
    assert "SYNTHETIC" in summary["data"] and summary["examples_per_sec"] > 0


def test_resume_continues_from_the_last_checkpoint(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 10})
    build(config, tmp_path).train(evaluate=False)
    assert tf.train.latest_checkpoint(tmp_path / "checkpoints").endswith("ckpt-10")

    config.trainer.train_steps = 20
    trainer = build(config, tmp_path)
    trainer.train(evaluate=False)
    assert int(trainer.step.numpy()) == 20
    assert int(trainer.optimizer.iterations.numpy()) == 20  # optimizer state came back too
    steps = sorted(s for s, _ in scalars(tmp_path, "train")["loss"])
    assert steps == [5, 10, 15, 20]  # continuous: no step trained twice, none missing

    again = build(config, tmp_path)  # a finished run does not retrain
    again.train(evaluate=False)
    assert int(again.step.numpy()) == 20
    assert sorted(s for s, _ in scalars(tmp_path, "train")["loss"]) == [5, 10, 15, 20]


def test_restore_gives_back_the_same_weights(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 5})
    trained = build(config, tmp_path)
    trained.train(evaluate=False)
    restored = build(tiny_config(**{"trainer.train_steps": 5, "seed": 7}), tmp_path)
    assert restored.restore()
    for a, b in zip(trained.model.weights + trained.optimizer.variables,
                    restored.model.weights + restored.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_eval_sees_every_example_once_with_two_replicas(tmp_path):
    # 103 examples, 8 per step (4 per replica): the last step is partial.
    config = tiny_config(**{"data.synthetic_test_size": 103, "data.global_batch_size": 8})
    trainer = build(config, tmp_path, strategy=two_replicas())
    results = trainer.evaluate()
    assert results["num_examples"] == 103

    test_images, test_labels = trainer.task.data.arrays["eval"]
    images = normalize(test_images, config.data.normalization)
    logits = trainer.model(images, training=False).numpy()
    expected_loss = keras.losses.sparse_categorical_crossentropy(
        test_labels, logits, from_logits=True).numpy().mean()
    expected_accuracy = (logits.argmax(-1) == test_labels).mean()
    np.testing.assert_allclose(results["loss"], expected_loss, rtol=1e-5)
    np.testing.assert_allclose(results["accuracy"], expected_accuracy, rtol=1e-6)
    assert trainer.evaluate() == results  # a second pass counts the same examples again


def test_zero_intervals_mean_only_at_the_end(tmp_path):
    config = tiny_config(**{"trainer.train_steps": 12, "trainer.log_every": 0,
                            "trainer.checkpoint_every": 0, "trainer.eval_every": 0})
    trainer = build(config, tmp_path)
    results = trainer.train()
    assert int(trainer.step.numpy()) == 12 and results["num_examples"] == 200
    assert tf.train.get_checkpoint_state(tmp_path / "checkpoints").all_model_checkpoint_paths \
        == [str(tmp_path / "checkpoints" / "ckpt-12")]
    assert sorted(s for s, _ in scalars(tmp_path, "train")["loss"]) == [12]
    assert sorted(s for s, _ in scalars(tmp_path, "eval")["loss"]) == [12]


@pytest.mark.parametrize("field,value", [("steps_per_loop", 0), ("log_every", -1),
                                         ("checkpoint_every", -5), ("train_steps", -5),
                                         ("train_steps", 0)])
def test_bad_intervals_are_clear_errors(tmp_path, field, value):
    config = tiny_config(**{f"trainer.{field}": value})
    with pytest.raises(ValueError, match=rf"trainer.{field}={value}.*integer"):
        build(config, tmp_path)
