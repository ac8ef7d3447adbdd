"""Text in, text out, inside the graph: the tokenizer as TensorFlow ops, and sampling
from a DecoderLM with a cache of keys and values, so each new token costs one
position's work instead of the whole window's. `--mode=sample`, the samples written at
each evaluation and the exported `generate` endpoint all run it.
"""

import numpy as np
import tensorflow as tf

from tasks.models.decoder import document_mask
from trainer.runtime.keras_internals import attention_projections


class GraphTokenizer(tf.Module):
    """A tokenizer of trainer/data/tokenizers.py as TensorFlow ops (SentencePiece through
    tensorflow-text, the `text` extra): it runs in tf.function, and in a SavedModel that
    tracks it (its model is a resource)."""

    def __init__(self, tokenizer):
        super().__init__(name="tokenizer")
        self.separator = tokenizer.separator
        if tokenizer.identity["kind"] == "bytes":
            self._model = None
            self._pieces = np.array([bytes([i]) for i in range(256)] + [b""], object)
        else:
            try:
                import tensorflow_text
            except ImportError as e:
                raise ImportError("A SentencePiece model runs in the graph with "
                                  "tensorflow-text, in the text extra: pip install -e "
                                  "'.[text]'.") from e
            with tf.init_scope():  # its resource made now, not inside the first function
                self._model = tensorflow_text.SentencepieceTokenizer(  # that uses it
                    model=tokenizer.model_proto, out_type=tf.int32)
                self._model.tokenize(tf.constant([""]))

    def tokenize(self, text):
        """RaggedTensor [batch, (ids)] int32 of a string tensor [batch]."""
        if self._model is not None:
            return self._model.tokenize(text)
        pieces = tf.strings.bytes_split(text)
        return pieces.with_flat_values(tf.cast(
            tf.io.decode_raw(pieces.flat_values, tf.uint8)[:, 0], tf.int32))

    def detokenize(self, ids):
        """A string tensor [batch] of int32 ids [batch, n] (no separator among them)."""
        if self._model is not None:
            return self._model.detokenize(ids)
        return tf.strings.reduce_join(tf.gather(tf.constant(self._pieces), ids), axis=-1)

    def windows(self, text, length):
        """int32 [batch, length]: each text as the end of a document, a separator before
        it, cut to its last `length` tokens or filled on the left with separators (each
        an empty document: what a window of packed documents holds)."""
        ids = self.tokenize(text)
        ids = tf.concat([tf.fill([ids.nrows(), 1], self.separator), ids], axis=1)
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        dense = ids.to_tensor(default_value=self.separator)
        take = lengths[:, None] - length + tf.range(length)[None]  # positions from the end
        return tf.where(take >= 0, tf.gather(dense, tf.maximum(take, 0), batch_dims=1),
                        self.separator)


class Sampler:
    """Samples continuations from `model` (a DecoderLM). A window of `seq_len` holds the
    context: the prompt's last seq_len // 2 tokens are read at once (prefill), then each
    new token attends to the cached keys and values; when the window is full, its last
    half becomes the next context."""

    def __init__(self, model, tokenizer, seq_len):
        if seq_len < 2:
            raise ValueError(f"model.seq_len={seq_len}: sampling needs a window of at "
                             "least 2 tokens (a context and a new one).")
        self.model, self.tokenizer, self.seq_len = model, tokenizer, seq_len
        self.context = seq_len // 2
        self._chunk = tf.function(self._chunk_fn)

    def generate(self, text, num_tokens, temperature=1.0, top_k=0, seed=0):
        """The continuation of each text ([batch] strings) after it: `num_tokens` tokens
        sampled at `temperature` from the `top_k` most likely (0: all), fewer where a
        separator (the end of the document) is sampled. The same seed gives the same
        text."""
        window = self.tokenizer.windows(text, self.context)
        out, done = [], tf.zeros([tf.shape(window)[0]], tf.bool)
        step = 0
        while step < num_tokens:  # (unrolled when traced: num_tokens is a Python int)
            n = min(self.seq_len - self.context, num_tokens - step)
            tokens, done = self._chunk(window, done, tf.constant(n), tf.constant(step),
                                       tf.cast(seed, tf.int32), float(temperature),
                                       int(top_k))
            out.append(tokens)
            window = tf.concat([window, tokens], axis=1)[:, -self.context:]
            step += n
        tokens = tf.concat(out, axis=1)
        ended = tf.cumsum(tf.cast(tf.equal(tokens, self.tokenizer.separator), tf.int32),
                          axis=1) > 0
        return self.tokenizer.detokenize(
            tf.RaggedTensor.from_tensor(tokens, lengths=tf.reduce_sum(
                tf.cast(~ended, tf.int32), axis=1)))

    def _chunk_fn(self, window, done, n, step, seed, temperature, top_k):
        """`n` tokens after `window` [batch, context], with the cache."""
        logits, cache = self.prefill(window)
        batch = tf.shape(window)[0]

        def body(i, logits, cache, tokens, done):
            token = self._sample(logits, temperature, top_k, tf.stack([seed, step + i]))
            token = tf.where(done, self.tokenizer.separator, token)
            tokens = tokens.write(i, token)
            done = done | tf.equal(token, self.tokenizer.separator)
            logits, cache = self.extend(token, self.context + i, cache)
            return i + 1, logits, cache, tokens, done

        _, _, _, tokens, done = tf.while_loop(
            lambda i, *_: i < n, body,
            (0, logits, cache, tf.TensorArray(tf.int32, size=n), done))
        return tf.reshape(tf.transpose(tokens.stack()), [batch, -1]), done

    @staticmethod
    def _sample(logits, temperature, top_k, seed):
        logits = logits / max(temperature, 1e-6)
        if top_k:
            kth = tf.math.top_k(logits, k=top_k).values[:, -1:]
            logits = tf.where(logits < kth, -1e9, logits)
        return tf.cast(tf.random.stateless_categorical(logits, 1, seed=seed)[:, 0], tf.int32)

    def prefill(self, window):
        """Logits after `window` [batch, context], and the cache: per block the keys and
        values [batch, seq_len, heads, head_dim] of the window's positions (zeros after),
        with each position's document (segment) number [batch, seq_len]."""
        m = self.model
        length = tf.shape(window)[1]
        x = m.embed(window) + tf.cast(m.positions(tf.range(length)), m.embed.compute_dtype)
        pad = [[0, 0], [0, self.seq_len - length], [0, 0], [0, 0]]
        mask, layers = self._document_mask(window), []
        for block in m.blocks:
            _, key, value, _ = attention_projections(block.attention)
            h = block.ln1(x)
            layers.append((tf.pad(key(h), pad), tf.pad(value(h), pad)))
            x = block(x, attention_mask=mask)
        segments = tf.cumsum(tf.cast(tf.equal(window, self.tokenizer.separator), tf.int32),
                             axis=1)
        cache = (layers, tf.pad(segments, [[0, 0], [0, self.seq_len - length]]))
        return self.model.logits(x[:, -1]), cache

    def _document_mask(self, tokens):
        if self.model.separator is None:
            return None
        return document_mask(tokens, self.model.separator)

    def extend(self, token, position, cache):
        """Logits after one more token [batch] at `position`, and the cache with it."""
        m, (layers, segments) = self.model, cache
        here = tf.one_hot(position, self.seq_len, dtype=tf.int32)[None]  # [1, seq_len]
        segment = (tf.reduce_max(segments * tf.cast(tf.range(self.seq_len) < position,
                                                    tf.int32), axis=1)
                   + tf.cast(tf.equal(token, self.tokenizer.separator), tf.int32))
        segments = segments * (1 - here) + segment[:, None] * here
        visible = tf.range(self.seq_len)[None] <= position  # causal
        if m.separator is not None:
            visible &= tf.equal(segments, segment[:, None])
        x = m.embed(token[:, None]) + tf.cast(m.positions(position[None]),
                                              m.embed.compute_dtype)[None]
        updated = []
        for block, (keys, values) in zip(m.blocks, layers):
            query, key, value, output = attention_projections(block.attention)
            h = block.ln1(x)
            where = tf.cast(here, keys.dtype)[:, :, None, None]
            keys = keys * (1 - where) + key(h) * where
            values = values * (1 - where) + value(h) * where
            updated.append((keys, values))
            q = tf.cast(query(h), tf.float32) / np.sqrt(float(keys.shape[-1]))
            scores = tf.einsum("bqhd,bkhd->bhqk", q, tf.cast(keys, tf.float32))
            scores = tf.where(visible[:, None, None, :], scores, -1e9)
            attended = tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(scores),
                                 tf.cast(values, tf.float32))
            x = x + tf.cast(output(tf.cast(attended, h.dtype)), x.dtype)
            x = x + tf.cast(block.mlp_out(block._gelu(block.mlp_in(block.ln2(x)))), x.dtype)
        return self.model.logits(x[:, 0]), (updated, segments)
