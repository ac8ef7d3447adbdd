import numpy as np
import tensorflow as tf

from trainer.step.loss_scale import LossScale, all_finite


def run_updates(ls, pattern):
    """Feeds a sequence of finite (True) / overflow (False) steps; returns applied flags."""
    return [bool(ls.update(tf.constant(f))) for f in pattern]


def test_dynamic_grows_after_growth_steps_finite_steps():
    ls = LossScale(enabled=True, dynamic=True, initial_scale=8.0, growth_steps=3)
    run_updates(ls, [True, True])
    assert ls.scale.numpy() == 8.0
    run_updates(ls, [True])
    assert ls.scale.numpy() == 16.0
    assert ls.good_steps.numpy() == 0
    run_updates(ls, [True] * 3)
    assert ls.scale.numpy() == 32.0


def test_dynamic_halves_and_skips_on_overflow():
    ls = LossScale(enabled=True, dynamic=True, initial_scale=2.0**15, growth_steps=2)
    applied = run_updates(ls, [True, False])
    assert applied == [True, False]
    assert ls.scale.numpy() == 2.0**14
    assert ls.good_steps.numpy() == 0  # the overflow reset the streak
    assert ls.skipped_steps.numpy() == 1
    run_updates(ls, [True])
    assert ls.scale.numpy() == 2.0**14  # one finite step is not enough to grow


def test_scale_never_below_one():
    ls = LossScale(enabled=True, initial_scale=2.0)
    run_updates(ls, [False] * 4)
    assert ls.scale.numpy() == 1.0
    assert ls.skipped_steps.numpy() == 4


def test_static_scale_fixed_but_still_skips():
    ls = LossScale(enabled=True, dynamic=False, initial_scale=128.0, growth_steps=1)
    applied = run_updates(ls, [True, True, False, True])
    assert applied == [True, True, False, True]
    assert ls.scale.numpy() == 128.0
    assert ls.skipped_steps.numpy() == 1


def test_scaling_roundtrip_and_disabled_is_identity():
    ls = LossScale(enabled=True, initial_scale=1024.0)
    loss = tf.constant(0.5)
    assert ls.get_scaled_loss(loss).numpy() == 512.0
    grads = [tf.constant([1024.0, 2048.0]),
             tf.IndexedSlices(tf.constant([[4096.0]]), tf.constant([0]), tf.constant([3, 1]))]
    unscaled = ls.get_unscaled_gradients(grads)
    np.testing.assert_allclose(unscaled[0].numpy(), [1.0, 2.0])
    np.testing.assert_allclose(unscaled[1].values.numpy(), [[4.0]])
    off = LossScale(enabled=False, initial_scale=1024.0)
    assert off.scale.numpy() == 1.0
    assert off.get_scaled_loss(loss) is loss
    assert off.get_unscaled_gradients(grads) is grads


def test_all_finite_sees_inf_and_nan_anywhere():
    ok = [tf.ones([2, 2]), tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]))]
    assert bool(all_finite(ok))
    assert not bool(all_finite(ok + [tf.constant([1.0, np.inf])]))
    assert not bool(all_finite([tf.IndexedSlices(tf.constant([[np.nan]]), tf.constant([0]))]))


def test_checkpoint_roundtrip(tmp_path):
    ls = LossScale(enabled=True, initial_scale=64.0, growth_steps=5)
    run_updates(ls, [True, True, False, True, True])
    path = tf.train.Checkpoint(loss_scale=ls).save(str(tmp_path / "ckpt"))
    restored = LossScale(enabled=True, initial_scale=64.0, growth_steps=5)
    tf.train.Checkpoint(loss_scale=restored).restore(path).assert_consumed()
    for name in ("scale", "good_steps", "skipped_steps"):
        assert getattr(restored, name).numpy() == getattr(ls, name).numpy(), name
    assert restored.scale.numpy() == 32.0 and restored.good_steps.numpy() == 2
