"""Text classification: labeled texts (trainer/data/labeled_text.py) tokenized once when
a run starts (tasks/text_tokens.py), then read by index in the step-indexed order of
trainer/data/order.py, so a resumed run reads what an uninterrupted one would, on any
topology. The model is tasks/models/text_classifier.py: the built-in transformer (the
language model's, so `init.checkpoint` of an LM run loads its encoder) or a pretrained
keras_hub backbone from a preset folder (tasks/models/presets.py).
"""

import functools

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tasks.classification_metrics import MacroF1, confusion_table
from tasks.models import presets
from tasks.models.text_classifier import POOLS, PretrainedClassifier, TransformerClassifier
from tasks.models.transformer import blocks_train_flops
from tasks.text_tokens import check_source_tokenizer, lm_run_config, text_features
from trainer.data import labeled_text
from trainer.data.order import step_indexed_batches
from trainer.task import Task, register

AUTOTUNE = tf.data.AUTOTUNE


@register("text")
class TextClassificationTask(Task):
    """Classifies texts into the classes their labels name; see configs/text.py."""

    def __init__(self, config):
        super().__init__(config)
        m = config.model
        if m.pool not in POOLS:
            raise ValueError(f"model.pool={m.pool!r} is unknown; choose one of {POOLS}.")
        if m.backbone != "transformer":
            presets.check_folder(m.backbone)
        self.seq_len = self.tokens_per_example = m.seq_len

    @functools.cached_property
    def data(self):
        return labeled_text.read(self.config.data)

    @property
    def label_names(self):
        return self.data.label_names

    @functools.cached_property
    def text_features(self):
        features = text_features(self.config, lambda: self.data.train.texts)
        check_source_tokenizer(self.config.init.checkpoint, features.identity)
        return features

    @functools.cached_property
    def _encoded(self):
        """{split: (ids [N, seq_len], lengths [N], labels [N])} as NumPy arrays."""
        encoded = {}
        for split in ("train", "eval"):
            texts = getattr(self.data, split).texts
            ids, lengths = self.text_features.encode_all(texts, split)
            encoded[split] = ids, lengths, np.asarray(getattr(self.data, split).labels,
                                                      np.int32)
        return encoded

    def describe_data(self):
        return self.data.describe(self.config.data.train)

    def data_paths(self):
        d = self.config.data
        return () if d.format == "tfds" else tuple(p for p in (d.train, d.eval)
                                                   if p and p != "stdlib")

    @functools.cached_property
    def causal(self):
        """model.causal, or True when starting from a language model: its encoder learned
        causal attention, and reading later tokens too would feed it what it never saw."""
        if not self.config.model.causal and lm_run_config(self.config.init.checkpoint):
            logging.info("model.causal: True, the attention of the language model in "
                         "init.checkpoint.")
            return True
        return self.config.model.causal

    def run_record(self):
        return {"label_names": self.label_names, "tokenizer": self.text_features.identity}

    def build_model(self):
        m, num_classes = self.config.model, len(self.label_names)
        if m.backbone == "transformer":
            model = TransformerClassifier(
                num_classes, m.pool, self.text_features.identity["vocab_size"], m.seq_len,
                m.num_layers, m.d_model, m.num_heads, m.mlp_dim, m.dropout, self.causal,
                m.remat, name="classifier")  # the names its checkpoints hold
        else:
            backbone = presets.load_backbone(m.backbone)
            model = PretrainedClassifier(backbone, num_classes, m.pool, m.dropout,
                                         name="classifier")
        model({"token_ids": tf.zeros((1, m.seq_len), tf.int32),
               "padding_mask": tf.ones((1, m.seq_len), tf.bool)})
        return model

    def flops_per_example(self):
        m = self.config.model
        if m.backbone != "transformer":
            return None  # counted on the backbone's graph
        return (blocks_train_flops(m.seq_len, m.num_layers, m.d_model, m.mlp_dim, self.causal)
                + 6 * m.d_model * len(self.label_names))

    def build_inputs(self, split, input_context, start_step=0):
        ids, lengths, labels = (tf.constant(a) for a in self._encoded[split])
        batch = input_context.get_per_replica_batch_size(self.config.data.global_batch_size)

        def examples(indices, _=None):
            length = tf.gather(lengths, indices)
            return ({"token_ids": tf.gather(ids, indices),
                     "padding_mask": tf.sequence_mask(length, self.seq_len)},
                    tf.gather(labels, indices))

        if split == "train":
            ds = step_indexed_batches(len(self._encoded[split][2]), batch, input_context,
                                      start_step, self.config.seed, examples)
        else:  # one pass, each text once: pipeline p reads texts p, p + P, ...
            ds = tf.data.Dataset.range(len(self._encoded[split][2])).shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id)
            ds = ds.batch(batch).map(examples, AUTOTUNE)
        return ds.prefetch(AUTOTUNE)

    def compute_loss(self, labels, outputs):
        return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)

    def build_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy"),
                MacroF1(len(self.label_names))]

    def update_metrics(self, metrics, labels, outputs):
        for metric in metrics:
            metric.update_state(labels, outputs)

    def eval_tables(self, metrics):
        """The eval's confusion matrix, rows the true classes."""
        matrix = next(m for m in metrics if isinstance(m, MacroF1)).matrix.numpy()
        return {"confusion_matrix": confusion_table(matrix, self.label_names)}

    def serving_input(self):
        """A batch of texts, tokenized as in training."""
        return (tf.TensorSpec([None], tf.string, name="text"),
                lambda text: self.text_features.features(text)[0])

    def serving_outputs(self, outputs):
        names = tf.constant(self.label_names)
        batch = tf.shape(outputs)[0]
        return {"probabilities": tf.nn.softmax(outputs), "logits": outputs,
                "label": tf.gather(names, tf.argmax(outputs, axis=-1)),
                "label_names": tf.tile(names[tf.newaxis], [batch, 1])}

    def serving_resources(self):
        return [self.text_features]

    def serving_settings(self):
        return {"tokenizer": self.text_features.identity, "label_names": self.label_names}
