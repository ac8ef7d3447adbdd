"""The transformer over token ids shared by the language model and the text classifier,
and the decoder-only language model on it."""

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


class TokenTransformer(keras.Model):
    """Token embeddings + learned positions -> Blocks -> a final LayerNorm (`ln`, applied
    by the subclass). Its layers are made in one order, so a DecoderLM and a
    TextClassifier of the same sizes hold the same variable names below their model's
    name: a classifier warm-starts from a language model's checkpoint as it is."""

    def __init__(self, vocab_size, seq_len, num_layers, d_model, num_heads, mlp_dim,
                 dropout=0.0, causal=True, remat=False, **kwargs):
        super().__init__(**kwargs)
        self.seq_len = seq_len
        self.embed = keras.layers.Embedding(vocab_size, d_model)
        self.positions = keras.layers.Embedding(seq_len, d_model)
        self.dropout = keras.layers.Dropout(dropout)
        self.blocks = [Block(d_model, num_heads, mlp_dim, dropout, causal=causal, remat=remat)
                       for _ in range(num_layers)]
        self.ln = keras.layers.LayerNormalization(epsilon=1e-5)

    def encode(self, tokens, training=False, attention_mask=None):
        """The last block's outputs [batch, T, d_model] (before `ln`)."""
        x = self.embed(tokens)
        x = x + tf.cast(self.positions(tf.range(tf.shape(tokens)[1])), x.dtype)[tf.newaxis]
        x = self.dropout(x, training=training)
        for block in self.blocks:
            x = block(x, training=training, attention_mask=attention_mask)
        return x


class DecoderLM(TokenTransformer):
    """Causal TokenTransformer -> float32 logits over the vocabulary (tied to the
    embeddings unless `tie_embeddings=False`). With a `separator` id, attention stays
    inside each document of a packed window (`document_mask`)."""

    def __init__(self, vocab_size, seq_len, num_layers, d_model, num_heads, mlp_dim,
                 dropout=0.0, tie_embeddings=True, remat=False, separator=None, **kwargs):
        super().__init__(vocab_size, seq_len, num_layers, d_model, num_heads, mlp_dim,
                         dropout, causal=True, remat=remat, **kwargs)
        self.tie_embeddings, self.separator = tie_embeddings, separator
        self.head = None if tie_embeddings else keras.layers.Dense(vocab_size, use_bias=False)

    def call(self, tokens, training=False):
        mask = None if self.separator is None else document_mask(tokens, self.separator)
        return self.logits(self.encode(tokens, training, mask))

    def logits(self, x):
        """float32 logits of the last block's outputs [..., d_model] (also what cached
        sampling computes for one position, tasks/models/generation.py)."""
        x = self.ln(x)
        if self.tie_embeddings:
            logits = tf.matmul(x, tf.cast(self.embed.embeddings, x.dtype), transpose_b=True)
        else:
            logits = self.head(x)
        return tf.cast(logits, tf.float32)
