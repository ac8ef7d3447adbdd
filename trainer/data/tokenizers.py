"""Tokenizers for preparing text: bytes, or a SentencePiece model (the `text` extra).

A tokenizer has an `identity` (a dict that token shards record, so shards made by
another tokenizer are refused) and `encode(utf8_bytes) -> ids`. It is pickled into the
processes of a prepare, so it holds its model as bytes, not as a loaded processor.
"""

import hashlib
import io

import numpy as np


class ByteTokenizer:
    """Bytes are tokens: every byte is kept, valid UTF-8 or not."""

    identity = {"kind": "bytes", "vocab_size": 256}

    @staticmethod
    def encode(text):
        return np.frombuffer(text, np.uint8)


class SentencePieceTokenizer:
    """A SentencePiece model (`.model` bytes). Trained here with byte fallback, so no
    text is unknown: a character outside the vocabulary becomes its UTF-8 bytes."""

    def __init__(self, model_proto):
        self.model_proto = bytes(model_proto)
        self._processor = None
        self.identity = {"kind": "sentencepiece", "vocab_size": self.processor.vocab_size(),
                         "model_sha256": hashlib.sha256(self.model_proto).hexdigest()}

    @classmethod
    def load(cls, path):
        with open(path, "rb") as f:
            return cls(f.read())

    @classmethod
    def train(cls, documents, vocab_size):
        """A model of `vocab_size` pieces trained on the lines of `documents` (UTF-8 bytes
        each), with byte fallback and digits split, and no normalization: the text a
        model reads and writes keeps its newlines, runs of spaces and every character.
        One thread, unshuffled: the same documents give the same model."""
        spm = _sentencepiece()
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=(line for d in documents for line in d.decode(
                "utf-8", errors="replace").splitlines() if line.strip()),
            model_writer=model, vocab_size=vocab_size, model_type="unigram",
            byte_fallback=True, split_digits=True, character_coverage=0.9995,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            input_sentence_size=0, shuffle_input_sentence=False,
            num_threads=1, max_sentence_length=1 << 16, minloglevel=2)
        return cls(model.getvalue())

    @property
    def processor(self):
        if self._processor is None:
            self._processor = _sentencepiece().SentencePieceProcessor(
                model_proto=self.model_proto)
        return self._processor

    def encode(self, text):
        """Ids of `text` (UTF-8 bytes; an invalid sequence becomes U+FFFD first)."""
        return np.asarray(self.processor.encode(text.decode("utf-8", errors="replace")),
                          np.int64)

    def decode(self, ids):
        return self.processor.decode([int(i) for i in ids])

    def __getstate__(self):  # a loaded processor does not pickle; each process loads its own
        return {"model_proto": self.model_proto, "identity": self.identity}

    def __setstate__(self, state):
        self.__dict__.update(state, _processor=None)


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError as e:
        raise ImportError("tokenizer.kind=sentencepiece needs the text extra: "
                          "pip install -e '.[text]'.") from e
    return sentencepiece
