"""Language modeling: next-token prediction over packed documents read from token shards.

The corpus is prepared once into shards (trainer/data/text_corpus.py, with the
tokenizer of trainer/data/tokenizers.py); training reads windows of them by index
(trainer/data/token_windows.py); the model is tasks/models/decoder.py and its sampling
tasks/models/generation.py.
"""

import functools
import math

import keras
import tensorflow as tf
from absl import logging

from tasks.models import generation
from tasks.models.decoder import DecoderLM
from tasks.models.transformer import blocks_train_flops
from trainer.data import text_corpus, token_shards, token_windows
from trainer.data.tokenizers import ByteTokenizer
from trainer.task import Task, register


def per_token_loss(labels, logits):
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


@register("lm")
class LMTask(Task):
    """Next-token prediction; bytes or SentencePiece pieces are the tokens."""

    def __init__(self, config):
        super().__init__(config)
        self.seq_len = config.model.seq_len
        self.tokens_per_example = self.seq_len
        self._corpus = None

    @property
    def corpus(self):
        """(shard directory, tokenizer, train split, eval split), prepared on first use."""
        if self._corpus is None:
            d = self.config.data
            if d.format not in ("text", "jsonl"):
                raise ValueError(f"data.format={d.format!r}: the LM reads text or jsonl.")
            where, tokenizer = text_corpus.ready(d, self.config.tokenizer)
            train, held_out = (token_shards.open_split(where, split, tokenizer.identity)
                               for split in ("train", "eval"))
            self._corpus = where, tokenizer, train, held_out
            logging.info("LM corpus: %s", self.describe_data())
        return self._corpus

    @property
    def tokenizer(self):
        if self.config.tokenizer.kind == "bytes":  # known without preparing anything
            return ByteTokenizer()
        return self.corpus[1]

    def prepare_data(self):
        self.corpus  # noqa: B018 (prepares the shards if they are not current)
        return self.describe_data()

    def flops_per_example(self):
        """The blocks and the vocabulary projection (tied or not) on seq_len tokens."""
        m = self.config.model
        return (blocks_train_flops(m.seq_len, m.num_layers, m.d_model, m.mlp_dim, causal=True)
                + 6 * m.d_model * self.tokenizer.identity["vocab_size"] * m.seq_len)

    def data_paths(self):
        d = self.config.data
        return tuple(p for p in (d.train, d.eval) if p and p != "stdlib")

    def describe_data(self):
        where, tokenizer, train, held_out = self.corpus
        return (f"{self.config.data.train or where} as {tokenizer.identity['kind']} tokens "
                f"in {where} ({train.num_documents} training documents, {len(train.tokens)} "
                f"tokens; {held_out.num_documents} held-out documents, "
                f"{len(held_out.tokens)} tokens)")

    def build_model(self):
        m, tokenizer = self.config.model, self.tokenizer
        model = DecoderLM(tokenizer.identity["vocab_size"], m.seq_len, m.num_layers,
                          m.d_model, m.num_heads, m.mlp_dim, m.dropout, m.tie_embeddings,
                          m.remat, separator=(tokenizer.separator
                                              if self.config.data.document_mask else None),
                          name="lm")  # the variable names its checkpoints hold
        model(tf.zeros((1, m.seq_len), tf.int32))
        return model

    def build_inputs(self, split, input_context, start_step=0):
        _, _, train, held_out = self.corpus
        d = self.config.data
        batch = input_context.get_per_replica_batch_size(d.global_batch_size)
        if split == "train":
            ds = token_windows.train_windows(train, self.seq_len, batch, input_context,
                                             start_step, self.config.seed)
        else:
            ds = token_windows.eval_windows(held_out, self.seq_len, d.eval_windows, batch,
                                            input_context)
        return ds.map(lambda w: (w[:, :-1], w[:, 1:])).prefetch(tf.data.AUTOTUNE)

    def compute_loss(self, labels, outputs):
        return per_token_loss(labels, outputs)  # [batch, seq_len]: one loss per token

    def build_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy"),
                keras.metrics.Sum("scored_tokens"), keras.metrics.Sum("target_bytes")]

    def update_metrics(self, metrics, labels, outputs):
        # One entry per token: Keras' Mean metrics would average each window first.
        labels = tf.reshape(labels, [-1])
        accuracy, scored, target_bytes = metrics
        accuracy.update_state(labels, tf.reshape(outputs, [tf.size(labels), -1]))
        scored.update_state(tf.cast(tf.size(labels), tf.float32))
        target_bytes.update_state(tf.gather(self._token_bytes, labels))

    @functools.cached_property
    def _token_bytes(self):
        """The UTF-8 bytes each id stands for (a NumPy array: a constant in each graph)."""
        return self.tokenizer.token_bytes()

    def derived_metrics(self):
        # Bits per byte of text, whatever the tokenizer: the mean loss (nats a token) in
        # bits, times tokens over the bytes they stand for. Runs with different
        # tokenizers compare on it.
        def bits_per_byte(r):
            tokens_per_byte = (r["scored_tokens"] / max(r["target_bytes"], 1.0)
                               if "target_bytes" in r else self._eval_tokens_per_byte)
            return r["loss"] / math.log(2.0) * tokens_per_byte
        return {"bits_per_byte": bits_per_byte}

    @functools.cached_property
    def _eval_tokens_per_byte(self):
        """Over the evaluated windows' targets: for results without the counts (a
        model.fit's evaluation of the same windows)."""
        _, _, _, held_out = self.corpus
        starts = token_windows.eval_indices(held_out, self.seq_len,
                                            self.config.data.eval_windows) * self.seq_len
        targets = held_out.windows(starts, self.seq_len + 1)[:, 1:]
        return targets.size / self._token_bytes[targets].sum()

    @functools.cached_property
    def graph_tokenizer(self):
        return generation.GraphTokenizer(self.tokenizer)

    def serving_input(self):
        """A batch of texts; the model reads each as the end of a document."""
        return (tf.TensorSpec([None], tf.string, name="text"),
                lambda text: self.graph_tokenizer.windows(text, self.seq_len))

    def serving_outputs(self, outputs):
        last = outputs[:, -1]
        return {"next_token_logits": last, "next_token_probabilities": tf.nn.softmax(last)}

    def serving_endpoints(self, model):
        """`generate`: texts in, each one's continuation out (sample.* settings)."""
        s = self.config.sample
        sampler = generation.Sampler(model, self.graph_tokenizer, self.seq_len)
        generate = tf.function(lambda text, seed: sampler.generate(
            text, s.num_tokens, s.temperature, s.top_k, seed))
        return {"generate": (generate, [tf.TensorSpec([None], tf.string, name="text"),
                                        tf.TensorSpec([], tf.int32, name="seed")])}

    def serving_resources(self):
        return [self.graph_tokenizer]

    def serving_settings(self):
        return {"tokenizer": self.tokenizer.identity, "sample": self.config.sample.to_dict()}

    def eval_sample(self, model):
        s = self.config.sample
        return self.generate(model, num_tokens=s.summary_tokens) if s.summary_tokens else None

    def generate(self, model, prompt=None, num_tokens=None):
        """`prompt` (config.sample.prompt if None) and the text sampled after it: up to
        `num_tokens` tokens (config.sample.num_tokens), fewer if the document ends."""
        s = self.config.sample
        prompt = s.prompt if prompt is None else prompt
        if getattr(self, "_sampler", None) is None or self._sampler.model is not model:
            self._sampler = generation.Sampler(model, self.graph_tokenizer, self.seq_len)
        text = self._sampler.generate(
            tf.constant([prompt]), s.num_tokens if num_tokens is None else num_tokens,
            s.temperature, s.top_k, s.seed)
        return prompt + text[0].numpy().decode("utf-8", errors="replace")
