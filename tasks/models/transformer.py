"""The one transformer block shared by the language model (causal) and the ViT (not causal)."""

import keras
import tensorflow as tf


def blocks_train_flops(tokens, num_layers, d_model, mlp_dim, causal):
    """Model FLOPs (forward and backward) of `num_layers` Blocks on one sequence: 6 x
    matmul parameters x tokens, plus attention's two matmuls (12 x tokens^2 x d_model a
    layer, half of it when causal), MaxText's convention."""
    params = num_layers * (4 * d_model * d_model + 2 * d_model * mlp_dim)
    attention = 12 * num_layers * tokens**2 * d_model * (0.5 if causal else 1.0)
    return 6 * params * tokens + attention


class Block(keras.layers.Layer):
    """Pre-LayerNorm transformer block: x + MHA(LN(x)), then x + MLP(LN(x)).

    `remat=True` recomputes the block in the backward pass (`tf.recompute_grad`)
    instead of keeping its activations. Dropout seeds are drawn *outside* the
    recomputed function and applied with stateless dropout, so the recomputation
    uses the same masks as the forward pass (a stateful Dropout layer would not).
    """

    def __init__(self, d_model, num_heads, mlp_dim, dropout=0.0, causal=False, remat=False,
                 **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"model.d_model={d_model} must be divisible by "
                             f"model.num_heads={num_heads}.")
        self.causal, self.remat, self.rate = causal, remat, dropout
        self.ln1 = keras.layers.LayerNormalization(epsilon=1e-5)
        self.attention = keras.layers.MultiHeadAttention(num_heads, d_model // num_heads)
        self.ln2 = keras.layers.LayerNormalization(epsilon=1e-5)
        self.mlp_in = keras.layers.Dense(mlp_dim)  # GELU applied in _forward, in float32
        self.mlp_out = keras.layers.Dense(d_model)
        self.seeds = keras.random.SeedGenerator()

    def build(self, input_shape):
        self.ln1.build(input_shape)
        self.attention.build(input_shape, input_shape)
        self.ln2.build(input_shape)
        self.mlp_in.build(input_shape)
        self.mlp_out.build(input_shape[:-1] + (self.mlp_in.units,))

    def _dropout(self, x, seed, training):
        if not training or not self.rate:
            return x
        return tf.nn.experimental.stateless_dropout(x, self.rate, seed=seed)

    def _gelu(self, h):
        """GELU in float32, back in the compute dtype. On CPU, TensorFlow's bfloat16
        elementwise kernels (Erfc, Mul) convert element by element and run slower than
        float32: the two casts cost less
        (docs/performance.md#why-bf16-gains-little-for-the-transformers-here), and float32 is
        the accurate side for every precision."""
        gelu = tf.nn.gelu(tf.cast(h, tf.float32), approximate=False)
        return tf.cast(gelu, self.mlp_out.compute_dtype)

    def _forward(self, x, seeds, training, attention_mask=None):
        h = self.ln1(x)
        h = self.attention(h, h, attention_mask=attention_mask, use_causal_mask=self.causal,
                           training=False)
        # Casts: a sublayer kept in float32 (precision_overrides) returns float32.
        x = x + tf.cast(self._dropout(h, seeds[0], training), x.dtype)
        h = self.mlp_out(self._gelu(self.mlp_in(self.ln2(x))))
        return x + tf.cast(self._dropout(h, seeds[1], training), x.dtype)

    def call(self, x, training=False, attention_mask=None):
        """`attention_mask`: bool [batch, T, T], which positions each may attend to (with
        `causal`, also only earlier ones)."""
        seeds = tf.cast(keras.random.randint((2, 2), 0, 2**30, seed=self.seeds), tf.int32) \
            if training and self.rate else tf.zeros((2, 2), tf.int32)
        if self.remat and training:
            return tf.recompute_grad(
                lambda y: self._forward(y, seeds, training, attention_mask))(x)
        return self._forward(x, seeds, training, attention_mask)
