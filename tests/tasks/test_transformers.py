"""The transformer models: causal attention, remat, and the ViT learning (the LM task:
test_lm.py)."""

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from configs import vit_cifar
import support
from support import tiny_config
from tasks.models.decoder import DecoderLM


def build(config, workdir, strategy=None):
    return support.build(config, workdir / "run", strategy)


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


