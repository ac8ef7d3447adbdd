"""Text classifiers: a sequence of token vectors pooled into one, then a Dense head.

Their features are {"token_ids": int32 [batch, T], "padding_mask": bool [batch, T]};
no position attends to padding. The backbone is either this project's TokenTransformer
(the language model's, so a classifier starts from a pretrained LM's checkpoint as it
is) or a pretrained keras_hub backbone read from a preset folder
(tasks/models/presets.py).
"""

import keras
import tensorflow as tf

from tasks.models.decoder import TokenTransformer

POOLS = ("first", "mean", "last")
HEAD = "classifier_head"  # the layer a classifier adds to its backbone


def pool(x, padding_mask, how):
    """[batch, T, d] -> [batch, d]: the first position, the mean over the unmasked ones,
    or the last unmasked one (what a causal backbone has read everything at)."""
    if how == "first":
        return x[:, 0]
    mask = tf.cast(padding_mask, x.dtype)
    if how == "mean":
        total = tf.reduce_sum(x * mask[..., None], axis=1)
        return total / tf.maximum(tf.reduce_sum(mask, axis=1, keepdims=True), 1)
    last = tf.maximum(tf.reduce_sum(tf.cast(padding_mask, tf.int32), axis=1) - 1, 0)
    return tf.gather(x, last, batch_dims=1)


class TransformerClassifier(TokenTransformer):
    """TokenTransformer (bidirectional unless `causal`) -> LayerNorm -> pool -> Dense."""

    def __init__(self, num_classes, pooling, vocab_size, seq_len, num_layers, d_model,
                 num_heads, mlp_dim, dropout=0.0, causal=False, remat=False, **kwargs):
        super().__init__(vocab_size, seq_len, num_layers, d_model, num_heads, mlp_dim,
                         dropout, causal=causal, remat=remat, **kwargs)
        self.pooling = pooling
        self.head = keras.layers.Dense(num_classes, name=HEAD)

    def call(self, features, training=False):
        mask = features["padding_mask"]
        keys = tf.broadcast_to(mask[:, tf.newaxis, :], tf.concat(  # [batch, T, T]
            [tf.shape(mask)[:1], tf.shape(mask)[1:], tf.shape(mask)[1:]], axis=0))
        x = self.ln(self.encode(features["token_ids"], training, attention_mask=keys))
        return tf.cast(self.head(pool(x, mask, self.pooling)), tf.float32)


class PretrainedClassifier(keras.Model):
    """A keras_hub backbone's sequence output -> pool -> dropout -> Dense."""

    def __init__(self, backbone, num_classes, pooling, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.backbone, self.pooling = backbone, pooling
        self.dropout = keras.layers.Dropout(dropout)
        self.head = keras.layers.Dense(num_classes, name=HEAD)
        self._inputs = set(backbone.input) if isinstance(backbone.input, dict) else set()

    def call(self, features, training=False):
        inputs = dict(features)
        if "segment_ids" in self._inputs:  # one segment (BERT-like backbones take two)
            inputs["segment_ids"] = tf.zeros_like(features["token_ids"])
        outputs = self.backbone(inputs, training=training)
        x = outputs["sequence_output"] if isinstance(outputs, dict) else outputs
        x = self.dropout(pool(x, features["padding_mask"], self.pooling), training=training)
        return tf.cast(self.head(x), tf.float32)
