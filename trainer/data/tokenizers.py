"""Tokenizers for text: bytes, or a SentencePiece model (the `text` extra).

A tokenizer has an `identity` (a dict that token shards record, so shards made by
another tokenizer are refused), a `separator` id that starts every document in a shard,
`encode(utf8_bytes) -> ids`, `decode(ids) -> str` and `token_bytes()`, the UTF-8 bytes
each id stands for (for bits per byte). It is pickled into the processes of a prepare,
so it holds its model as bytes, not as a loaded processor.
"""

import hashlib
import io
import re

import numpy as np


_INVALID_BYTES = re.compile("([\udc80-\udcff]+)")  # bytes surrogateescape could not decode


class ByteTokenizer:
    """Bytes are tokens (ids 0-255), and 256 separates documents: every byte is kept,
    valid UTF-8 or not."""

    separator = 256
    identity = {"kind": "bytes", "vocab_size": 257, "separator": 256}

    @staticmethod
    def encode(text):
        return np.frombuffer(text, np.uint8)

    @staticmethod
    def decode(ids):
        """UTF-8 text of the byte ids (a separator ends it; a cut sequence is replaced)."""
        ids = list(ids)
        ids = ids[:ids.index(256)] if 256 in ids else ids
        return bytes(ids).decode("utf-8", errors="replace")

    @staticmethod
    def token_bytes():
        return np.ones(257, np.float32)  # the separator counts as one byte, as a newline


class SentencePieceTokenizer:
    """A SentencePiece model (`.model` bytes) whose end-of-sentence id separates
    documents. Trained here with byte fallback, so no text is unknown: a character
    outside the vocabulary becomes its UTF-8 bytes."""

    def __init__(self, model_proto, source="a SentencePiece model"):
        self.model_proto = bytes(model_proto)
        self._processor = None
        processor = self.processor
        self.separator = processor.eos_id()
        if self.separator < 0:
            raise ValueError(f"{source} has no end-of-sentence piece (eos_id=-1), which "
                             "separates documents: train it with one (the default).")
        self.identity = {"kind": "sentencepiece", "vocab_size": processor.vocab_size(),
                         "separator": self.separator,
                         "model_sha256": hashlib.sha256(self.model_proto).hexdigest()}

    @classmethod
    def load(cls, path, read=None):
        """The model in file `path`, read by `read(path) -> bytes` (default: a local
        file)."""
        try:
            if read:
                proto = read(path)
            else:
                with open(path, "rb") as f:
                    proto = f.read()
        except Exception as e:  # OSError, or what `read` raises for a remote file
            raise FileNotFoundError(f"Cannot read the SentencePiece model {path} "
                                    f"(tokenizer.model): {e}") from e
        try:
            return cls(proto, source=path)
        except RuntimeError as e:  # sentencepiece's error for a file that is no model
            raise ValueError(f"{path} (tokenizer.model) is not a SentencePiece model: "
                             f"{e}.") from e

    @classmethod
    def train(cls, documents, vocab_size):
        """A model of `vocab_size` pieces trained on the lines of `documents` (UTF-8 bytes
        each), with byte fallback and digits split, and no normalization or added
        prefix: decode(encode(text)) is the text, newlines, runs of spaces and every
        character kept. One thread, unshuffled: the same documents give the same model."""
        spm = _sentencepiece()
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=(line for d in documents for line in d.decode(
                    "utf-8", errors="replace").splitlines() if line.strip()),
                model_writer=model, vocab_size=vocab_size, model_type="unigram",
                byte_fallback=True, split_digits=True, character_coverage=0.9995,
                normalization_rule_name="identity", remove_extra_whitespaces=False,
                add_dummy_prefix=False, input_sentence_size=0,
                shuffle_input_sentence=False, num_threads=1, max_sentence_length=1 << 16,
                minloglevel=2)
        except RuntimeError as e:
            raise ValueError(
                f"Cannot train a SentencePiece vocabulary of {vocab_size} pieces on these "
                f"documents ({e}). It holds the 256 byte pieces, 3 control pieces and the "
                "text's characters first, and the text must give the rest: change "
                "tokenizer.vocab_size or give more text.") from e
        return cls(model.getvalue())

    @property
    def processor(self):
        if self._processor is None:
            self._processor = _sentencepiece().SentencePieceProcessor(
                model_proto=self.model_proto)
        return self._processor

    def encode(self, text):
        """Ids of `text` (UTF-8 bytes); a byte that is not valid UTF-8 becomes its byte
        piece, as a character outside the vocabulary does."""
        try:
            return np.asarray(self.processor.encode(text.decode("utf-8")), np.int64)
        except UnicodeDecodeError:
            pass
        ids = []  # valid runs encoded as text, each invalid byte (a surrogate here) alone
        for run in _INVALID_BYTES.split(text.decode("utf-8", errors="surrogateescape")):
            if run and _INVALID_BYTES.fullmatch(run):
                ids += [self.processor.piece_to_id(f"<0x{ord(c) - 0xDC00:02X}>")
                        for c in run]
            elif run:
                ids += self.processor.encode(run)
        return np.asarray(ids, np.int64)

    def decode(self, ids):
        """The text of `ids`, up to a separator."""
        ids = [int(i) for i in ids]
        return self.processor.decode(ids[:ids.index(self.separator)]
                                     if self.separator in ids else ids)

    def token_bytes(self):
        """UTF-8 bytes of each piece as decoded: a byte piece is one, a control piece
        none, and the separator one (as a newline)."""
        p = self.processor
        sizes = [1 if p.is_byte(i) else 0 if p.is_control(i) or p.is_unknown(i)
                 else len(p.id_to_piece(i).replace("\u2581", " ").encode())
                 for i in range(p.vocab_size())]
        sizes[self.separator] = 1
        return np.asarray(sizes, np.float32)

    def __getstate__(self):  # a loaded processor does not pickle; each process loads its own
        return {"model_proto": self.model_proto, "identity": self.identity,
                "separator": self.separator}

    def __setstate__(self, state):
        self.__dict__.update(state, _processor=None)


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError as e:
        raise ImportError("tokenizer.kind=sentencepiece needs the text extra: "
                          "pip install -e '.[text]'.") from e
    return sentencepiece
