"""Byte-level language modeling: bytes are tokens, so there is no tokenizer to download.
The model is tasks/models/decoder.py; the corpus, trainer/data/text.py."""

import math

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tasks.models.decoder import DecoderLM
from tasks.models.transformer import blocks_train_flops
from trainer.data.order import step_indexed_batches
from trainer.data.text import read_corpus
from trainer.task import Task, register

VOCAB = 256  # one token per byte value


def per_token_loss(labels, logits):
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


@register("lm")
class ByteLMTask(Task):
    """Next-byte prediction on a glob of text files."""

    def __init__(self, config):
        super().__init__(config)
        self.seq_len = config.model.seq_len
        self.tokens_per_example = self.seq_len
        self._splits = None

    @property
    def splits(self):
        """(train bytes, validation bytes) as uint8 arrays; the last fraction validates."""
        if self._splits is None:
            d = self.config.data
            data = np.frombuffer(read_corpus(d.files, d.max_bytes), dtype=np.uint8)
            n_val = int(len(data) * d.validation_fraction)
            if n_val < 2 or len(data) - n_val < self.seq_len + 1:
                raise ValueError(
                    f"data.files={d.files!r} gives {len(data)} bytes: too few for "
                    f"validation_fraction={d.validation_fraction} and seq_len={self.seq_len}.")
            self._splits = data[:-n_val], data[-n_val - 1:]  # +1: context for the first byte
            logging.info("Corpus %s: %d train bytes, %d validation bytes.", d.files,
                         len(data) - n_val, n_val)
        return self._splits

    def flops_per_example(self):
        """The blocks and the vocabulary projection (tied or not) on seq_len tokens."""
        m = self.config.model
        return (blocks_train_flops(m.seq_len, m.num_layers, m.d_model, m.mlp_dim, causal=True)
                + 6 * m.d_model * VOCAB * m.seq_len)

    def data_paths(self):
        return () if self.config.data.files == "stdlib" else (self.config.data.files,)

    def describe_data(self):
        train, val = self.splits
        return f"text files {self.config.data.files} ({len(train)} + {len(val) - 1} bytes)"

    def build_model(self):
        m = self.config.model
        model = DecoderLM(VOCAB, m.seq_len, m.num_layers, m.d_model, m.num_heads, m.mlp_dim,
                          m.dropout, m.tie_embeddings, m.remat,
                          name="byte_lm")  # the variable names its checkpoints hold
        model(tf.zeros((1, m.seq_len), tf.int32))
        return model

    def build_inputs(self, split, input_context, start_step=0):
        train, val = self.splits
        batch = input_context.get_per_replica_batch_size(self.config.data.global_batch_size)
        window = self.seq_len + 1
        if split == "train":
            # Example i is the window starting at byte i: a pure function of the step.
            data = tf.constant(train)
            offsets = tf.range(window, dtype=tf.int64)[tf.newaxis]
            positions = len(train) - window + 1
            if batch > positions:
                raise ValueError(
                    f"The training text has {positions} windows of seq_len+1 bytes, fewer "
                    f"than a replica's batch of {batch}: use more text (data.files, "
                    "data.max_bytes) or a smaller data.global_batch_size.")
            ds = step_indexed_batches(
                positions, batch, input_context, start_step, self.config.seed,
                lambda starts, g: tf.gather(data, starts[:, tf.newaxis] + offsets))
        else:
            # Consecutive windows; each validation byte is a target exactly once. The
            # last, shorter window becomes a batch of its own.
            n_full = (len(val) - 1) // self.seq_len
            full = val[:n_full * self.seq_len + 1]
            idx = np.arange(n_full)[:, None] * self.seq_len + np.arange(window)[None]
            ds = tf.data.Dataset.from_tensor_slices(full[idx]).batch(batch)
            rest = val[n_full * self.seq_len:]
            if len(rest) > 1:
                ds = ds.concatenate(tf.data.Dataset.from_tensors(rest[None]))
            if input_context.num_input_pipelines > 1:
                ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        ds = ds.map(lambda w: (tf.cast(w[:, :-1], tf.int32), tf.cast(w[:, 1:], tf.int32)))
        return ds.prefetch(tf.data.AUTOTUNE)

    def eval_sample(self, model):
        s = self.config.sample
        return self.generate(model, num_tokens=s.summary_tokens) if s.summary_tokens else None

    def serving_input(self):
        """Byte ids [batch, length <= seq_len]; the logits predict each next byte."""
        def checked(tokens):
            length = tf.debugging.assert_less_equal(
                tf.shape(tokens)[1], self.seq_len,
                message=f"tokens: at most seq_len={self.seq_len} byte ids per row")
            with tf.control_dependencies([length]):
                return tf.identity(tokens)

        return tf.TensorSpec([None, None], tf.int32, name="tokens"), checked

    def compute_loss(self, labels, outputs):
        return per_token_loss(labels, outputs)  # [batch, seq_len]: one loss per token

    def build_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy"),
                keras.metrics.Sum("scored_tokens")]

    def metrics_of_loss(self):
        # The mean next-byte cross-entropy is the loss: in bits, not computed again.
        return {"bits_per_byte": lambda loss: loss / math.log(2.0)}

    def update_metrics(self, metrics, labels, outputs):
        # One entry per token: Keras' Mean metrics would average each window first.
        labels, outputs = tf.reshape(labels, [-1]), tf.reshape(outputs, [-1, VOCAB])
        accuracy, scored = metrics
        accuracy.update_state(labels, outputs)
        scored.update_state(tf.cast(tf.size(labels), tf.float32))

    def generate(self, model, prompt=None, num_tokens=None):
        """`prompt` (config.sample.prompt if None) and the `num_tokens` bytes sampled after
        it (config.sample.num_tokens), decoded as UTF-8 (a cut sequence is replaced)."""
        s = self.config.sample
        prompt = list((s.prompt if prompt is None else prompt).encode())
        tokens = self.sample_tokens(model, prompt, s.num_tokens if num_tokens is None
                                    else num_tokens, s.temperature, s.top_k, s.seed)
        return bytes(prompt + tokens).decode("utf-8", errors="replace")

    def sample_tokens(self, model, prompt, num_tokens, temperature=1.0, top_k=0, seed=0):
        """`num_tokens` token ids sampled after the ids `prompt`; reproducible per seed."""
        window = np.zeros((1, self.seq_len), np.int32)
        if getattr(self, "_sampled_model", None) is not model:  # traced once per model
            self._sampled_model = model
            self._next_logits = tf.function(
                lambda tokens, position: model(tokens, training=False)[0, position])
        next_logits = self._next_logits

        out = list(prompt) or [ord("\n")]
        for i in range(num_tokens):
            context = out[-self.seq_len:]
            window[0, :len(context)] = context  # causal: the zeros after it are never seen
            logits = next_logits(tf.constant(window), tf.constant(len(context) - 1))
            logits = logits / max(temperature, 1e-6)
            if top_k:
                kth = tf.math.top_k(logits, k=top_k).values[-1]
                logits = tf.where(logits < kth, -1e9, logits)
            out.append(int(tf.random.stateless_categorical(logits[None], 1, seed=(seed, i))[0, 0]))
        return out[len(prompt) or 1:]
