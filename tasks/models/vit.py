"""Vision Transformer for square images, built from the LM's encoder Block (not causal)."""

import keras
import tensorflow as tf

from tasks.models.transformer import Block, blocks_train_flops


class ViT(keras.Model):
    """Patches -> linear embedding + learned positions -> Blocks -> LayerNorm -> logits."""

    def __init__(self, image_size, patch_size, num_layers, d_model, num_heads, mlp_dim,
                 dropout=0.0, pool="cls", remat=False, num_classes=10, **kwargs):
        super().__init__(**kwargs)
        if image_size % patch_size:
            raise ValueError(f"model.patch_size={patch_size} must divide the image size "
                             f"{image_size}.")
        if pool not in ("cls", "gap"):
            raise ValueError(f"model.pool={pool!r} must be 'cls' or 'gap'.")
        self.pool = pool
        num_tokens = (image_size // patch_size) ** 2 + (pool == "cls")
        self.patchify = keras.layers.Conv2D(d_model, patch_size, strides=patch_size)
        self.cls_token = self.add_weight(shape=(1, 1, d_model), initializer="zeros",
                                         name="cls_token") if pool == "cls" else None
        self.positions = keras.layers.Embedding(num_tokens, d_model)
        self.dropout = keras.layers.Dropout(dropout)
        self.blocks = [Block(d_model, num_heads, mlp_dim, dropout, causal=False, remat=remat)
                       for _ in range(num_layers)]
        self.ln = keras.layers.LayerNormalization(epsilon=1e-5)
        self.head = keras.layers.Dense(num_classes, dtype="float32")

    def call(self, images, training=False):
        x = self.patchify(images)
        x = tf.reshape(x, (tf.shape(x)[0], -1, x.shape[-1]))
        if self.cls_token is not None:
            cls = tf.cast(self.cls_token, x.dtype)
            x = tf.concat([tf.tile(cls, (tf.shape(x)[0], 1, 1)), x], axis=1)
        x = self.dropout(x + tf.cast(self.positions(tf.range(tf.shape(x)[1])), x.dtype)[tf.newaxis],
                         training=training)
        for block in self.blocks:
            x = block(x, training=training)
        x = self.ln(x)
        return self.head(x[:, 0] if self.pool == "cls" else tf.reduce_mean(x, axis=1))


def vit_train_flops(m, num_classes=10, image_size=32):
    """Model FLOPs of one image: the patch embedding, the blocks (not causal), the head."""
    patches = (image_size // m.patch_size) ** 2
    tokens = patches + (m.pool == "cls")
    return (6 * patches * m.patch_size**2 * 3 * m.d_model
            + blocks_train_flops(tokens, m.num_layers, m.d_model, m.mlp_dim, causal=False)
            + 6 * m.d_model * num_classes)


def vit(m, num_classes=10, image_size=32):
    """`m` is `config.model` (patch_size, num_layers, d_model, num_heads, mlp_dim, ...)."""
    model = ViT(image_size, m.patch_size, m.num_layers, m.d_model, m.num_heads, m.mlp_dim,
                m.dropout, m.pool, m.remat, num_classes)
    model(tf.zeros((1, image_size, image_size, 3)))
    return model
