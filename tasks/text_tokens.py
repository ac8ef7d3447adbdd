"""Texts to a classifier's features, by TensorFlow ops: the same function tokenizes
the training and eval texts (once, when a run starts) and the strings an export is
sent, so what the model is served is what it was trained on.

A text becomes at most `seq_len` ids: this project's tokenizers (bytes, SentencePiece)
put their separator first, as the language model sees a document start; a keras_hub
tokenizer puts its start and end tokens around the text (BERT's [CLS] ... [SEP]).
Longer texts are cut (and counted), shorter ones padded; `padding_mask` is True on
the ids that are text.
"""

import fcntl
import hashlib
import json
import os
import time

import ml_collections
import numpy as np
import tensorflow as tf
from absl import logging

from tasks.models import presets
from tasks.models.generation import GraphTokenizer
from trainer.data import text_corpus
from trainer.data.prepare_text import read_file
from trainer.data.tokenizers import ByteTokenizer, SentencePieceTokenizer
from trainer.runtime import user_cache
from trainer.state.workdir import read_json
from trainer.step.warm_start import TASK_RECORD, source_workdir

CHUNK = 4096  # texts tokenized per call when a run starts


class TextFeatures(tf.Module):
    """`features(text)` for a tokenizer of trainer/data/tokenizers.py or a keras_hub one."""

    def __init__(self, seq_len, tokenizer=None, keras_hub_tokenizer=None):
        super().__init__(name="text_features")
        self.seq_len = seq_len
        if keras_hub_tokenizer is not None:
            self.tokenizer = keras_hub_tokenizer
            t = keras_hub_tokenizer
            self.start, self.end = t.start_token_id, t.end_token_id
            self.pad = t.pad_token_id if t.pad_token_id is not None else 0
            identity = {"kind": "keras_hub", "class": type(t).__name__,
                        "vocab_size": t.vocabulary_size()}
        else:
            self.tokenizer = GraphTokenizer(tokenizer)
            self.start, self.end, self.pad = tokenizer.separator, None, tokenizer.separator
            identity = dict(tokenizer.identity)
            if identity["kind"] == "sentencepiece":  # which vocabulary, not only its size
                identity["sha256"] = hashlib.sha256(tokenizer.model_proto).hexdigest()[:16]
        self.keras_hub = keras_hub_tokenizer is not None
        self._identity = json.dumps(identity)  # a string: tf.Module wraps a dict

    @property
    def identity(self):
        """The tokenizer's kind and vocabulary size (JSON), recorded with the run."""
        return json.loads(self._identity)

    def ids(self, text):
        """RaggedTensor [batch, (ids)] of a string tensor [batch], before packing. A
        keras_hub tokenizer gets valid UTF-8 (a bad byte is U+FFFD); ours keep bytes."""
        if self.keras_hub:
            text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace")
        ids = self.tokenizer.tokenize(text)
        if not isinstance(ids, tf.RaggedTensor):  # a tokenizer that pads its output
            ids = tf.RaggedTensor.from_tensor(ids, padding=self.pad)
        return tf.cast(ids, tf.int32)

    def features(self, text):
        """({"token_ids": int32 [batch, seq_len], "padding_mask": bool}, truncated [batch])."""
        ids = self.ids(text)
        room = self.seq_len - 1 - (self.end is not None)
        truncated = ids.row_lengths() > room
        ids = ids[:, :room]
        rows = ids.nrows()
        parts = [tf.fill([rows, 1], self.start), ids]
        if self.end is not None:
            parts.append(tf.fill([rows, 1], self.end))
        ids = tf.concat(parts, axis=1)
        token_ids = ids.to_tensor(default_value=self.pad, shape=[None, self.seq_len])
        mask = tf.sequence_mask(ids.row_lengths(), self.seq_len)
        return {"token_ids": token_ids, "padding_mask": mask}, truncated

    def encode_all(self, texts, what):
        """(int32 ids [N, seq_len], int32 lengths [N]) of a list of UTF-8 texts, with the
        count of texts cut to seq_len logged."""
        if not texts:
            return np.zeros((0, self.seq_len), np.int32), np.zeros((0,), np.int32)
        # As a graph, as served (eagerly, a keras_hub tokenizer returns Python lists).
        features_of = tf.function(self.features, input_signature=[
            tf.TensorSpec([None], tf.string)])
        ids, lengths, truncated = [], [], 0
        for i in range(0, len(texts), CHUNK):
            features, cut = features_of(tf.constant(texts[i:i + CHUNK], tf.string))
            ids.append(features["token_ids"].numpy())
            lengths.append(tf.reduce_sum(tf.cast(features["padding_mask"], tf.int32),
                                         axis=1).numpy())
            truncated += int(tf.reduce_sum(tf.cast(cut, tf.int32)))
        if truncated:
            logging.info("%d of the %d %s texts are longer than model.seq_len=%d tokens "
                         "and were cut to it.", truncated, len(texts), what, self.seq_len)
        return np.concatenate(ids), np.concatenate(lengths)


def text_features(config, training_texts):
    """TextFeatures for the config: a keras_hub preset's own tokenizer, the tokenizer of
    the language model that init.checkpoint names (its ids are what its embeddings
    mean), or `tokenizer.*` (a SentencePiece model of tokenizer.vocab_size pieces, if
    none is named, trained on `training_texts()` once and kept in the user cache)."""
    seq_len, backbone = config.model.seq_len, config.model.backbone
    if backbone != "transformer":
        return TextFeatures(seq_len, keras_hub_tokenizer=presets.load_tokenizer(backbone))
    settings = config.tokenizer
    lm = lm_run_config(config.init.checkpoint)
    if lm is not None:
        settings = _lm_tokenizer(lm, settings, config.init.checkpoint)
    if settings.kind not in text_corpus.KINDS:
        raise ValueError(f"tokenizer.kind={settings.kind!r} is unknown; choose one of "
                         f"{text_corpus.KINDS}.")
    if settings.kind == "bytes":
        return TextFeatures(seq_len, tokenizer=ByteTokenizer())
    if settings.model:
        return TextFeatures(seq_len, tokenizer=SentencePieceTokenizer.load(
            os.path.expanduser(settings.model), read=read_file))
    return TextFeatures(seq_len, tokenizer=_trained(training_texts(), settings))


def lm_run_config(checkpoint):
    """The config of the language-model run `checkpoint` (its workdir, or a checkpoint
    in it) belongs to, or None (no init, or another kind of source)."""
    workdir = source_workdir(checkpoint)
    config = workdir and read_json(os.path.join(workdir, "config.json"),
                                   "the init run's config")
    if not config or config.get("task", {}).get("name") != "lm":
        return None
    return ml_collections.ConfigDict(config)


def check_source_tokenizer(checkpoint, identity):
    """A classifier run as init.checkpoint was trained on a tokenizer's ids: the same
    one, or an error (its embeddings would load meaning other pieces)."""
    workdir = source_workdir(checkpoint)
    record = workdir and read_json(os.path.join(workdir, TASK_RECORD), "the init run's record")
    if record and record.get("tokenizer") not in (None, identity):
        raise ValueError(
            f"init.checkpoint={checkpoint} was trained on the tokenizer "
            f"{json.dumps(record['tokenizer'])}, this run's is {json.dumps(identity)}: its "
            "embeddings mean the other's ids. Set --config.tokenizer.* (a SentencePiece "
            "vocabulary: tokenizer.model) to the one it was trained with.")


def _lm_tokenizer(lm, settings, checkpoint):
    """The LM run's tokenizer settings, its SentencePiece model named by path."""
    chosen = ml_collections.ConfigDict(lm.tokenizer.to_dict())
    if chosen.kind == "sentencepiece" and not chosen.model:
        chosen.model = os.path.join(text_corpus.directory(lm.data, lm.tokenizer),
                                    text_corpus.TOKENIZER_FILE)
        if not tf.io.gfile.exists(chosen.model):
            raise FileNotFoundError(
                f"init.checkpoint={checkpoint} is a language model whose SentencePiece "
                f"vocabulary was kept with its token shards, in {chosen.model}, which is "
                "gone: name the vocabulary it was trained with, --config.tokenizer.model=.")
    if settings.model and os.path.expanduser(settings.model) != os.path.expanduser(
            chosen.model):
        raise ValueError(f"tokenizer.model={settings.model}, but init.checkpoint={checkpoint} "
                         f"is a language model trained with {chosen.model or 'bytes'}: its "
                         "embeddings mean that tokenizer's ids. Leave tokenizer.model empty.")
    logging.info("Tokenizer: the one of the language model in init.checkpoint (%s%s).",
                 chosen.kind, f", {chosen.model}" if chosen.model else "")
    return chosen


def _trained(texts, settings):
    """A SentencePiece model trained on up to tokenizer.train_sample_bytes of `texts`
    (in the order of their hashes: every class, whatever order they were read in),
    cached by their content: the same texts give the same model, once per machine."""
    sample, size = [], 0
    for text in sorted(texts, key=lambda t: hashlib.sha256(t).digest()):
        if size >= settings.train_sample_bytes:
            break
        sample.append(text)
        size += len(text)
    digest = hashlib.sha256(repr(settings.vocab_size).encode())
    for text in sample:
        digest.update(hashlib.sha256(text).digest())
    path = user_cache.path(os.path.join("tokenizers", digest.hexdigest()[:16] + ".model"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # processes of one machine train it once
        if os.path.isfile(path):
            logging.info("Tokenizer: the SentencePiece vocabulary trained before on these "
                         "texts, %s.", path)
            return SentencePieceTokenizer.load(path, read=read_file)
        start = time.monotonic()
        tokenizer = SentencePieceTokenizer.train(sample, settings.vocab_size)
        with open(path + ".tmp", "wb") as f:
            f.write(tokenizer.model_proto)
        os.replace(path + ".tmp", path)
    logging.info("Tokenizer: trained a SentencePiece vocabulary of %d pieces on %d texts "
                 "in %.1f s: %s.", settings.vocab_size, len(sample),
                 time.monotonic() - start, path)
    return tokenizer
