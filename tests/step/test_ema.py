"""EMA of the weights: applied steps only, the same on every replica, swapped in to
evaluate and export, exactly swapped out, checkpointed."""

import numpy as np
import pytest
import tensorflow as tf

from support import build, tiny_config, two_replicas
from support.array_task import data, make_trainer, replica_weights
from trainer.actions import export as export_lib
from trainer.state.checkpoints import IncompatibleCheckpointError

DECAY = 0.8


def ema_trainer(tmp_path, x, y, strategy=None, decay=DECAY, **overrides):
    return make_trainer(strategy or tf.distribute.get_strategy(), x, y, tmp_path,
                        **{"optimizer.ema_decay": decay, "trainer.max_nonfinite_steps": 5,
                           **overrides})


def test_ema_is_the_closed_form_of_the_applied_weights_on_every_replica(tmp_path):
    steps = 6
    x, y = data(steps, np.random.default_rng(0))
    x[3 * 8] = np.nan  # step 4 is skipped: it must leave the average alone
    trainer, it = ema_trainer(tmp_path, x, y, two_replicas())
    applied = []  # the raw weights after each applied step
    for _ in range(steps):
        before = int(trainer.optimizer.iterations.numpy())
        trainer.train_loop(it, tf.constant(1, tf.int64))
        if int(trainer.optimizer.iterations.numpy()) > before:
            applied.append(replica_weights(trainer)[0])
    assert len(applied) == steps - 1 and int(trainer.loss_scale.skipped_steps.numpy()) == 1
    expected = applied[0]  # Keras starts the average at the first applied weights
    for weights in applied[1:]:
        expected = [DECAY * e + (1 - DECAY) * w for e, w in zip(expected, weights)]
    averages = replica_weights(trainer, trainer.ema.averages)
    for r in range(2):
        for got, want in zip(averages[r], expected):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    for a0, a1 in zip(*averages):
        np.testing.assert_array_equal(a0, a1)
        assert a0.dtype == np.float32


def test_evaluation_uses_the_ema_and_puts_the_raw_weights_back_bitwise(tmp_path):
    x, y = data(4, np.random.default_rng(1))
    trainer, it = ema_trainer(tmp_path, x, y, two_replicas(),
                              **{"optimizer.learning_rate": 0.5})
    trainer.train_loop(it, tf.constant(4, tf.int64))
    raw = replica_weights(trainer)
    averages = replica_weights(trainer, trainer.ema.averages)
    with_ema = trainer.evaluate()
    after, averages_after = replica_weights(trainer), replica_weights(trainer, trainer.ema.averages)
    for r in range(2):
        for a, b in zip(raw[r] + averages[r], after[r] + averages_after[r]):
            np.testing.assert_array_equal(a, b)
    ema, trainer.ema = trainer.ema, None
    without = trainer.evaluate()
    trainer.ema = ema
    assert with_ema["loss"] != without["loss"]
    # What was scored is the EMA: the same pass with the averages as the weights.
    for v, a in zip(trainer.model.trainable_variables, averages[0]):
        v.assign(a)
    np.testing.assert_allclose(trainer.evaluate()["loss"], with_ema["loss"], rtol=1e-6)


def test_a_failed_evaluation_still_puts_the_raw_weights_back(tmp_path, monkeypatch):
    x, y = data(2, np.random.default_rng(2))
    trainer, it = ema_trainer(tmp_path, x, y)
    trainer.train_loop(it, tf.constant(2, tf.int64))
    raw = [v.numpy() for v in trainer.model.trainable_variables]

    def fail(dataset, progress):
        raise RuntimeError("eval failed")
    monkeypatch.setattr(trainer.evaluation, "run", fail)
    with pytest.raises(RuntimeError, match="eval failed"):
        trainer.evaluate()
    for v, r in zip(trainer.model.trainable_variables, raw):
        np.testing.assert_array_equal(v.numpy(), r)


def test_resume_keeps_the_ema_and_export_serves_it(tmp_path):
    x, y = data(3, np.random.default_rng(3))
    trainer, it = ema_trainer(tmp_path, x, y)
    trainer.train_loop(it, tf.constant(3, tf.int64))
    trainer.checkpoints.save()
    averages = [a.numpy() for a in trainer.ema.averages]
    resumed, _ = ema_trainer(tmp_path, x, y)
    assert resumed.restore() and int(resumed.step.numpy()) == 3
    for a, b in zip(averages, resumed.ema.averages):
        np.testing.assert_array_equal(a, b.numpy())
    model, step, weights = export_lib._load(trainer.config, trainer.task,
                                            trainer.checkpoints.latest, "float32", None)
    assert (step, weights) == (3, "ema")
    for a, v in zip(averages, model.trainable_variables):
        np.testing.assert_array_equal(a, v.numpy())
    # Without eval.use_ema the export serves the raw weights.
    config = trainer.config.copy_and_resolve_references()
    config.eval.use_ema = False
    model, _, weights = export_lib._load(config, trainer.task, trainer.checkpoints.latest,
                                         "float32", None)
    assert weights == "raw"
    for v, served in zip(trainer.model.trainable_variables, model.trainable_variables):
        np.testing.assert_array_equal(v.numpy(), served.numpy())


def test_turning_the_ema_on_mid_run_is_refused_with_the_cause(tmp_path):
    x, y = data(2, np.random.default_rng(4))
    trainer, it = ema_trainer(tmp_path, x, y, decay=0.0)
    trainer.train_loop(it, tf.constant(2, tf.int64))
    trainer.checkpoints.save()
    with_ema, _ = ema_trainer(tmp_path, x, y)
    with pytest.raises(IncompatibleCheckpointError, match="does not fit this run"):
        with_ema.restore()


@pytest.mark.parametrize("decay", [1.0, -0.1])
def test_bad_ema_decay_is_a_clear_error(tmp_path, decay):
    with pytest.raises(ValueError, match=r"optimizer.ema_decay=.* must be a number in \[0, 1\)"):
        make_trainer(tf.distribute.get_strategy(), *data(1, np.random.default_rng(0)),
                     tmp_path, **{"optimizer.ema_decay": decay})


def test_ema_off_adds_nothing(tmp_path):
    """No EMA variable in the model, the optimizer or the checkpoint (an EMA run has them)."""
    assert tiny_config().optimizer.ema_decay == 0.0
    x, y = data(1, np.random.default_rng(0))
    for decay in (0.0, DECAY):
        trainer, it = ema_trainer(tmp_path / str(decay), x, y, decay=decay)
        averages = len(trainer.trained_variables) if decay else 0
        assert (trainer.ema is None) == (not averages)
        assert not any("average" in v.path for v in trainer.model.variables)
        slots = [n for n in trainer.checkpoints.named["optimizer"] if n.endswith("/average")]
        assert len(slots) == averages  # SGD without momentum: no other slot
        trainer.train_loop(it, tf.constant(1, tf.int64))
        trainer.checkpoints.save()
        saved = tf.train.load_checkpoint(trainer.checkpoints.latest).get_variable_to_shape_map()
        assert len([k for k in saved if "average" in k]) == averages


def test_before_the_first_applied_update_the_ema_is_the_initial_weights(tmp_path):
    """Keras creates the averages as zeros: evaluating them would score a zero model."""
    x, y = data(2, np.random.default_rng(5))
    trainer, _ = ema_trainer(tmp_path, x, y)
    with_ema = trainer.evaluate()
    ema, trainer.ema = trainer.ema, None
    np.testing.assert_allclose(trainer.evaluate()["loss"], with_ema["loss"], rtol=1e-6)
    for v, a in zip(trainer.model.trainable_variables, ema.averages):
        np.testing.assert_array_equal(v.numpy(), a.numpy())


def test_sample_mode_samples_from_the_ema_weights(tmp_path, capfdbinary):
    from support.lm import tiny_lm
    from trainer import cli
    config = tiny_lm(tmp_path, **{"trainer.train_steps": 20, "trainer.steps_per_loop": 10,
                                  "trainer.checkpoint_every": 20, "optimizer.warmup_steps": 2,
                                  "optimizer.ema_decay": 0.9, "sample.num_tokens": 40})
    workdir = str(tmp_path / "run")
    trainer = build(config, tmp_path / "run")
    trainer.train(evaluate=False)
    raw = trainer.task.generate(trainer.model)
    with trainer.eval_weights():
        ema = trainer.task.generate(trainer.model)
    assert raw != ema  # the two weights say different things
    capfdbinary.readouterr()
    cli.execute(config, workdir, "sample")
    assert capfdbinary.readouterr().out.decode() == ema + "\n"
