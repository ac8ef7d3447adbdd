"""Token shards: a split's documents as one flat file of token ids, read by memory map.

The layout is Megatron's `.bin`/`.idx` idea, kept to what an exact, topology-independent
resume needs (nanoGPT memory-maps a flat token file the same way):

    <directory>/<split>.bin    every document's token ids, in order, little-endian
                               uint16 when the vocabulary fits (<= 65,536 ids), else uint32
    <directory>/<split>.idx    int64 [documents + 1]: where each document starts in .bin,
                               then the total
    <directory>/meta.json      the tokenizer's identity, the dtype, and per split the
                               documents, tokens and file sizes

A write names no split complete while it runs (`begin`), writes each split beside the
old files (`SplitWriter`), then moves them in and names them all in one meta.json
(`commit`): a kill at any point leaves every split it touched incomplete, never a mix
of two writes, and a reader that maps the old files keeps them. NumPy's memory maps read
a window without reading the rest: resident memory does not grow with the corpus.
"""

import json
import os

import numpy as np

META = "meta.json"
INDEX_DTYPE = np.dtype("<i8")


def token_dtype(vocab_size):
    """uint16 when every id fits in it, else uint32."""
    if vocab_size < 1:
        raise ValueError(f"A vocabulary of {vocab_size} ids holds no token.")
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def begin(directory, splits, tokenizer):
    """Before writing `splits` with `tokenizer` (its identity dict): none of them reads
    as complete any more. Shards of another tokenizer that stay complete are refused."""
    os.makedirs(directory, exist_ok=True)
    meta = _read_meta(directory) or {"splits": {}}
    kept = {s: r for s, r in meta["splits"].items() if s not in splits}
    if kept and meta["tokenizer"] != tokenizer:
        raise ValueError(_other_tokenizer(directory, meta["tokenizer"], tokenizer))
    _write_meta(directory, {"tokenizer": tokenizer, "dtype": token_dtype(
        tokenizer["vocab_size"]).str, "splits": kept})


class SplitWriter:
    """Streams one split's documents to `<split>.bin.tmp` and `.idx.tmp`: one document
    and one offset at a time in memory."""

    def __init__(self, directory, split, tokenizer):
        self.directory, self.split, self.vocab_size = directory, split, tokenizer["vocab_size"]
        self.dtype = token_dtype(self.vocab_size)
        bin_path, idx_path = _paths(directory, split)
        self._tokens, self._index = open(bin_path + ".tmp", "wb"), open(idx_path + ".tmp", "wb")
        self.documents, self.total = 0, 0
        self._index.write(np.zeros(1, INDEX_DTYPE).tobytes())

    def add(self, ids, name):
        """Appends document `name` (a 1-D integer array of its ids)."""
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"{name}: a token id is outside [0, {self.vocab_size}) (the "
                             "tokenizer's vocabulary).")
        self._tokens.write(ids.astype(self.dtype).tobytes())
        self.documents, self.total = self.documents + 1, self.total + ids.size
        self._index.write(np.asarray([self.total], INDEX_DTYPE).tobytes())

    def close(self):
        """Flushes the files to disk; returns the split's record."""
        for f in (self._tokens, self._index):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return {"documents": self.documents, "tokens": self.total,
                "bin_bytes": self.total * self.dtype.itemsize,
                "idx_bytes": (self.documents + 1) * INDEX_DTYPE.itemsize}


def commit(directory, records):
    """Moves the written splits ({split: record}) in and names them complete at once."""
    for split in records:
        for path in _paths(directory, split):
            os.replace(path + ".tmp", path)
    _sync_directory(directory)
    meta = _read_meta(directory)
    meta["splits"].update(records)
    _write_meta(directory, meta)


class Split:
    """A complete split: `tokens` and `offsets` (int64 [documents + 1]), both memory
    maps."""

    def __init__(self, tokens, offsets):
        self.tokens, self.offsets = tokens, offsets

    @property
    def num_documents(self):
        return len(self.offsets) - 1

    def document(self, i):
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


def open_split(directory, split, tokenizer):
    """The complete split `split` of `directory`, prepared by `tokenizer` (its identity
    dict); an error naming what is wrong and what to do otherwise."""
    meta = _read_meta(directory)
    if not meta or split not in meta["splits"]:
        raise FileNotFoundError(
            f"{directory} holds no complete {split!r} split (an interrupted or never-run "
            "prepare): prepare it again.")
    if meta["tokenizer"] != tokenizer:
        raise ValueError(_other_tokenizer(directory, meta["tokenizer"], tokenizer))
    record, (bin_path, idx_path) = meta["splits"][split], _paths(directory, split)
    for path, key in ((bin_path, "bin_bytes"), (idx_path, "idx_bytes")):
        size = os.path.getsize(path) if os.path.exists(path) else None
        if size != record[key]:
            raise ValueError(
                f"{path} has {size if size is not None else 'no'} bytes, but {META} "
                f"records {record[key]}: the file was truncated or replaced after it was "
                "prepared. Prepare the split again.")
    offsets = np.memmap(idx_path, INDEX_DTYPE, mode="r")
    if offsets[0] != 0 or offsets[-1] != record["tokens"]:
        raise ValueError(f"{idx_path} does not index the {record['tokens']} tokens "
                         f"{META} records: prepare the split again.")
    dtype = np.dtype(meta["dtype"])
    tokens = (np.memmap(bin_path, dtype, mode="r") if record["tokens"]
              else np.zeros([0], dtype))  # (numpy cannot map an empty file)
    return Split(tokens, offsets)


def _paths(directory, split):
    return os.path.join(directory, f"{split}.bin"), os.path.join(directory, f"{split}.idx")


def _read_meta(directory):
    path = os.path.join(directory, META)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _write_meta(directory, meta):
    """Replaces meta.json at once (a rename): a reader sees the old record or the new."""
    path = os.path.join(directory, META)
    with open(path + ".tmp", "w") as f:
        json.dump(meta, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    _sync_directory(directory)


def _sync_directory(directory):
    """Makes the renames in `directory` durable (a power loss keeps them)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _other_tokenizer(directory, prepared, asked):
    return (f"{directory} was prepared with the tokenizer {prepared}, but this config asks "
            f"for {asked}: prepare into another directory, or set the tokenizer it was "
            "prepared with.")
