"""A decoder-only transformer language model."""

import keras
import tensorflow as tf

from tasks.models.transformer import Block


def document_mask(tokens, separator):
    """bool [batch, T, T]: position i may attend to j when both are in one document. A
    separator starts a document (token shards put one before each), so the prediction
    at a separator, of a document's first token, sees only that separator, and the
    prediction of a separator (the end of a document) sees the document it ends."""
    segments = tf.cumsum(tf.cast(tf.equal(tokens, separator), tf.int32), axis=1)
    return tf.equal(segments[:, :, tf.newaxis], segments[:, tf.newaxis, :])


class DecoderLM(keras.Model):
    """Token embeddings + learned positions -> causal Blocks -> LayerNorm -> float32
    logits over the vocabulary (tied to the embeddings unless `tie_embeddings=False`).
    With a `separator` id, attention stays inside each document of a packed window
    (`document_mask`)."""

    def __init__(self, vocab_size, seq_len, num_layers, d_model, num_heads, mlp_dim,
                 dropout=0.0, tie_embeddings=True, remat=False, separator=None, **kwargs):
        super().__init__(**kwargs)
        self.seq_len, self.tie_embeddings, self.separator = seq_len, tie_embeddings, separator
        self.embed = keras.layers.Embedding(vocab_size, d_model)
        self.positions = keras.layers.Embedding(seq_len, d_model)
        self.dropout = keras.layers.Dropout(dropout)
        self.blocks = [Block(d_model, num_heads, mlp_dim, dropout, causal=True, remat=remat)
                       for _ in range(num_layers)]
        self.ln = keras.layers.LayerNormalization(epsilon=1e-5)
        self.head = None if tie_embeddings else keras.layers.Dense(vocab_size, use_bias=False)

    def call(self, tokens, training=False):
        length = tf.shape(tokens)[1]
        x = self.embed(tokens)
        x = x + tf.cast(self.positions(tf.range(length)), x.dtype)[tf.newaxis]
        x = self.dropout(x, training=training)
        mask = None if self.separator is None else document_mask(tokens, self.separator)
        for block in self.blocks:
            x = block(x, training=training, attention_mask=mask)
        return self.logits(x)

    def logits(self, x):
        """float32 logits of the last block's outputs [..., d_model] (also what cached
        sampling computes for one position, tasks/models/generation.py)."""
        x = self.ln(x)
        if self.tie_embeddings:
            logits = tf.matmul(x, tf.cast(self.embed.embeddings, x.dtype), transpose_b=True)
        else:
            logits = self.head(x)
        return tf.cast(logits, tf.float32)
