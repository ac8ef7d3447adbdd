"""Byte-level decoder-only language model: bytes are tokens, no tokenizer to download."""

import glob
import math
import os
import sysconfig

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tasks import base, register
from tasks.input_order import step_indexed_batches
from tasks.transformer import Block, blocks_train_flops

VOCAB = 256


def corpus_files(pattern):
    """`stdlib` = the running Python's standard library .py files (present offline),
    without the third-party packages installed beneath it. A local pattern may use
    `**`; a remote one (gs://...) is matched by tf.io.gfile.glob, which has no `**`."""
    stdlib = pattern == "stdlib"
    if stdlib:
        pattern = os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py")
    if "://" in pattern:
        matches = [f for f in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(f)]
    else:
        matches = [f for f in glob.glob(os.path.expanduser(pattern), recursive=True)
                   if os.path.isfile(f)]
    files = sorted(f for f in matches if not (stdlib and "-packages" + os.sep in f))
    if not files:
        raise FileNotFoundError(f"data.files={pattern!r} matches no files; point "
                                "--config.data.files at a glob of text files.")
    return files


def read_corpus(pattern, max_bytes=0):
    """All matching files' bytes, concatenated in sorted path order."""
    chunks, total = [], 0
    for path in corpus_files(pattern):
        try:
            with tf.io.gfile.GFile(path, "rb") as f:
                chunk = f.read()
        except (OSError, tf.errors.OpError) as e:
            raise OSError(f"Cannot read {path} (matched by data.files={pattern!r}): {e}") from e
        chunks.append(chunk)
        total += len(chunk)
        if max_bytes and total >= max_bytes:
            break
    data = b"".join(chunks)
    return data[:max_bytes] if max_bytes else data


class ByteLM(keras.Model):
    """Embeddings + learned positions -> causal Blocks -> LayerNorm -> float32 logits."""

    def __init__(self, seq_len, num_layers, d_model, num_heads, mlp_dim, dropout=0.0,
                 tie_embeddings=True, remat=False, **kwargs):
        super().__init__(**kwargs)
        self.seq_len, self.tie_embeddings = seq_len, tie_embeddings
        self.embed = keras.layers.Embedding(VOCAB, d_model)
        self.positions = keras.layers.Embedding(seq_len, d_model)
        self.dropout = keras.layers.Dropout(dropout)
        self.blocks = [Block(d_model, num_heads, mlp_dim, dropout, causal=True, remat=remat)
                       for _ in range(num_layers)]
        self.ln = keras.layers.LayerNormalization(epsilon=1e-5)
        self.head = None if tie_embeddings else keras.layers.Dense(VOCAB, use_bias=False)

    def call(self, tokens, training=False):
        length = tf.shape(tokens)[1]
        x = self.embed(tokens)
        x = x + tf.cast(self.positions(tf.range(length)), x.dtype)[tf.newaxis]
        x = self.dropout(x, training=training)
        for block in self.blocks:
            x = block(x, training=training)
        x = self.ln(x)
        if self.tie_embeddings:
            logits = tf.matmul(x, tf.cast(self.embed.embeddings, x.dtype), transpose_b=True)
        else:
            logits = self.head(x)
        return tf.cast(logits, tf.float32)


def per_byte_loss(labels, logits):
    return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


@register("lm")
class ByteLMTask(base.Task):
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
        model = ByteLM(m.seq_len, m.num_layers, m.d_model, m.num_heads, m.mlp_dim, m.dropout,
                       m.tie_embeddings, m.remat)
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
        if not s.summary_bytes:
            return None
        prompt = s.prompt.encode()
        text = prompt + self.sample(model, prompt, s.summary_bytes, s.temperature, s.top_k,
                                    s.seed)
        return text.decode("utf-8", errors="replace")

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
        return per_byte_loss(labels, outputs)  # [batch, seq_len]: one loss per byte

    def build_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy("accuracy"),
                keras.metrics.Sum("scored_bytes")]

    def metrics_of_loss(self):
        # The mean next-byte cross-entropy is the loss: in bits, not computed again.
        return {"bits_per_byte": lambda loss: loss / math.log(2.0)}

    def update_metrics(self, metrics, labels, outputs):
        # One entry per byte: Keras' Mean metrics would average each window first.
        labels, outputs = tf.reshape(labels, [-1]), tf.reshape(outputs, [-1, VOCAB])
        accuracy, scored = metrics
        accuracy.update_state(labels, outputs)
        scored.update_state(tf.cast(tf.size(labels), tf.float32))

    def sample(self, model, prompt, num_bytes, temperature=1.0, top_k=0, seed=0):
        """Continues `prompt` (bytes) by `num_bytes` sampled bytes; reproducible per seed."""
        window = np.zeros((1, self.seq_len), np.int32)
        if getattr(self, "_sampled_model", None) is not model:  # traced once per model
            self._sampled_model = model
            self._next_logits = tf.function(
                lambda tokens, position: model(tokens, training=False)[0, position])
        next_logits = self._next_logits

        out = list(prompt) or [ord("\n")]
        for i in range(num_bytes):
            context = out[-self.seq_len:]
            window[0, :len(context)] = context  # causal: the zeros after it are never seen
            logits = next_logits(tf.constant(window), tf.constant(len(context) - 1))
            logits = logits / max(temperature, 1e-6)
            if top_k:
                kth = tf.math.top_k(logits, k=top_k).values[-1]
                logits = tf.where(logits < kth, -1e9, logits)
            out.append(int(tf.random.stateless_categorical(logits[None], 1, seed=(seed, i))[0, 0]))
        return bytes(out[len(prompt) or 1:])
