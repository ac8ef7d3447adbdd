"""Token shards: a split's documents as one flat file of token ids, read by memory map.

The layout is Megatron's `.bin`/`.idx` idea, kept to what an exact, topology-independent
resume needs (nanoGPT memory-maps a flat token file the same way):

    <directory>/<split>.bin    every document's token ids, in order, little-endian
                               uint16 when the vocabulary fits (<= 65,536 ids), else uint32
    <directory>/<split>.idx    int64 [documents + 1]: where each document starts in .bin,
                               then the total
    <directory>/meta.json      the tokenizer's identity, the dtype, and per split the
                               documents, tokens and file sizes; written last

A split is complete only when meta.json names it and its files have the sizes meta.json
records, so an interrupted write never reads as complete: `open_split` refuses it, and a
writer starts the split again. NumPy's memory map reads a window without reading the rest:
resident memory does not grow with the corpus (page cache aside).
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


def write_split(directory, split, documents, tokenizer):
    """Writes `documents` (an iterable of 1-D integer arrays, each one document's ids) as
    split `split`, streaming: one document is in memory at a time. `tokenizer` is the
    identity dict of the tokenizer that made them ({"kind", "vocab_size", ...}), recorded
    in meta.json, where the split is named once its files are complete. Returns the
    split's record."""
    dtype = token_dtype(tokenizer["vocab_size"])
    os.makedirs(directory, exist_ok=True)
    meta = _read_meta(directory)
    if meta and meta["tokenizer"] != tokenizer:
        raise ValueError(_other_tokenizer(directory, meta["tokenizer"], tokenizer))
    bin_path, idx_path = _paths(directory, split)
    _forget(directory, split)  # a split being written is never complete
    offsets, total = [0], 0
    with open(bin_path, "wb") as tokens, open(idx_path, "wb") as index:
        for document in documents:
            ids = np.asarray(document)
            if ids.size and (ids.min() < 0 or ids.max() >= tokenizer["vocab_size"]):
                raise ValueError(f"A token id of document {len(offsets) - 1} is outside "
                                 f"[0, {tokenizer['vocab_size']}) (the tokenizer's "
                                 "vocabulary).")
            tokens.write(ids.astype(dtype).tobytes())
            total += ids.size
            offsets.append(total)
        index.write(np.asarray(offsets, INDEX_DTYPE).tobytes())
        for f in (tokens, index):
            f.flush()
            os.fsync(f.fileno())
    record = {"documents": len(offsets) - 1, "tokens": total,
              "bin_bytes": os.path.getsize(bin_path), "idx_bytes": os.path.getsize(idx_path)}
    meta = _read_meta(directory) or {"tokenizer": tokenizer, "dtype": dtype.str,
                                     "splits": {}}
    meta["splits"][split] = record
    _write_meta(directory, meta)
    return record


class Split:
    """A complete split: `tokens` (a read-only memory map of every id) and `offsets`
    (int64 [documents + 1])."""

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
    offsets = np.fromfile(idx_path, INDEX_DTYPE)
    if len(offsets) != record["documents"] + 1 or offsets[-1] != record["tokens"]:
        raise ValueError(f"{idx_path} does not index the {record['tokens']} tokens of "
                         f"{record['documents']} documents {META} records: prepare the "
                         "split again.")
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


def _forget(directory, split):
    meta = _read_meta(directory)
    if meta and split in meta["splits"]:
        del meta["splits"][split]
        _write_meta(directory, meta)


def _other_tokenizer(directory, prepared, asked):
    return (f"{directory} was prepared with the tokenizer {prepared}, but this config asks "
            f"for {asked}: prepare into another directory, or set the tokenizer it was "
            "prepared with.")
