"""Token shards: a split's documents as one flat file of token ids, read by memory map.

The layout is Megatron's `.bin`/`.idx` idea, kept to what an exact, topology-independent
resume needs (nanoGPT memory-maps a flat token file the same way):

    <directory>/<split>.bin    the packed documents: each one's token ids after the
                               tokenizer's separator, little-endian uint16 when the
                               vocabulary fits (<= 65,536 ids), else uint32
    <directory>/<split>.idx    int64 [documents + 1]: where each document (its
                               separator) starts in .bin, then the total
    <directory>/meta.json      the tokenizer's identity, the dtype, per split the
                               documents, tokens and file sizes, and what was read

A write names no split complete while it runs (`begin`), writes each split beside the
old files (`SplitWriter`), then moves them in and names them all in one meta.json
(`commit`): a kill at any point leaves every split it touched incomplete, never a mix
of two writes, and a reader that maps the old files keeps them. NumPy's memory maps read
a window without reading the rest: resident memory does not grow with the corpus. A
remote directory (gs://) is read window by window through tf.io.gfile.
"""

import json
import os
import threading

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
        raise ValueError(other_tokenizer(directory, meta["tokenizer"], tokenizer))
    _write_meta(directory, {"tokenizer": tokenizer, "dtype": token_dtype(
        tokenizer["vocab_size"]).str, "splits": kept})


def checked_ids(ids, vocab_size, name):
    """`ids` in the shards' dtype; an error naming document `name` for one outside the
    vocabulary."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{name}: a token id is outside [0, {vocab_size}) (the "
                         "tokenizer's vocabulary).")
    return ids.astype(token_dtype(vocab_size), copy=False)


class SplitWriter:
    """Streams one split's documents to `<split>.bin.tmp` and `.idx.tmp`: one document
    and one offset at a time in memory."""

    def __init__(self, directory, split, tokenizer):
        self.directory, self.split, self.vocab_size = directory, split, tokenizer["vocab_size"]
        self.separator = np.asarray([tokenizer["separator"]])
        self.dtype = token_dtype(self.vocab_size)
        bin_path, idx_path = _paths(directory, split)
        self._tokens, self._index = open(bin_path + ".tmp", "wb"), open(idx_path + ".tmp", "wb")
        self.documents, self.total = 0, 0
        self._index.write(np.zeros(1, INDEX_DTYPE).tobytes())

    def add(self, ids, name):
        """Appends document `name` (a 1-D integer array of its ids)."""
        ids = checked_ids(ids, self.vocab_size, name)
        self._tokens.write(self.separator.astype(self.dtype).tobytes())
        self._tokens.write(ids.tobytes())
        self.documents, self.total = self.documents + 1, self.total + 1 + ids.size
        self._index.write(np.asarray([self.total], INDEX_DTYPE).tobytes())

    def abort(self):
        """Closes and removes what was written (a failed prepare)."""
        for f in (self._tokens, self._index):
            f.close()
            os.remove(f.name)

    def close(self):
        """Flushes the files to disk; returns the split's record."""
        for f in (self._tokens, self._index):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return {"documents": self.documents, "tokens": self.total,
                "bin_bytes": self.total * self.dtype.itemsize,
                "idx_bytes": (self.documents + 1) * INDEX_DTYPE.itemsize}


def commit(directory, records, inputs=None):
    """Moves the written splits ({split: record}) in and names them complete at once,
    with `inputs` (what they were made from: a JSON-able record, see `inputs`)."""
    for split in records:
        for path in _paths(directory, split):
            os.replace(path + ".tmp", path)
    _sync_directory(directory)
    meta = _read_meta(directory)
    meta["splits"].update(records)
    meta["inputs"] = inputs
    _write_meta(directory, meta)


def tokenizer(directory):
    """The identity of the tokenizer of `directory`'s complete shards, or None (none is
    complete)."""
    meta = _read_meta(directory)
    return meta["tokenizer"] if meta and meta["splits"] else None


def inputs(directory):
    """The `inputs` record of the last complete prepare of `directory`, or None."""
    meta = _read_meta(directory)
    return meta.get("inputs") if meta else None


class Split:
    """A complete split: `tokens` (the packed documents) and `offsets` (int64
    [documents + 1]), memory maps of local files, or arrays read on demand from remote
    ones."""

    def __init__(self, tokens, offsets):
        self.tokens, self.offsets = tokens, offsets

    @property
    def num_documents(self):
        return len(self.offsets) - 1

    def document(self, i):
        """Document i's ids, without the separator before it."""
        return self.tokens[self.offsets[i] + 1:self.offsets[i + 1]]

    def windows(self, starts, length):
        """int32 [len(starts), length]: the tokens from each start."""
        starts = np.asarray(starts, np.int64)
        if isinstance(self.tokens, np.ndarray):  # a memory map: one gather
            return self.tokens[starts[:, None] + np.arange(length)].astype(np.int32)
        out = np.zeros([len(starts), length], np.int32)
        for row, start in enumerate(starts):
            out[row] = self.tokens[start:start + length]
        return out


def open_split(directory, split, tokenizer):
    """The complete split `split` of `directory`, prepared by `tokenizer` (its identity
    dict); an error naming what is wrong and what to do otherwise."""
    meta = _read_meta(directory)
    if not meta or split not in meta["splits"]:
        raise FileNotFoundError(
            f"{directory} holds no complete {split!r} split (an interrupted or never-run "
            "prepare): prepare it again.")
    if meta["tokenizer"] != tokenizer:
        raise ValueError(other_tokenizer(directory, meta["tokenizer"], tokenizer))
    record, (bin_path, idx_path) = meta["splits"][split], _paths(directory, split)
    remote = _is_remote(directory)
    for path, key in ((bin_path, "bin_bytes"), (idx_path, "idx_bytes")):
        size = file_size(path)
        if size != record[key]:
            raise ValueError(
                f"{path} has {size if size is not None else 'no'} bytes, but {META} "
                f"records {record[key]}: the file was truncated or replaced after it was "
                "prepared. Prepare the split again.")
    offsets = (np.frombuffer(gfile().GFile(idx_path, "rb").read(), INDEX_DTYPE) if remote
               else np.memmap(idx_path, INDEX_DTYPE, mode="r"))
    if offsets[0] != 0 or offsets[-1] != record["tokens"]:
        raise ValueError(f"{idx_path} does not index the {record['tokens']} tokens "
                         f"{META} records: prepare the split again.")
    dtype = np.dtype(meta["dtype"])
    if remote:
        tokens = _RemoteTokens(bin_path, dtype, record["tokens"])
    else:
        tokens = (np.memmap(bin_path, dtype, mode="r") if record["tokens"]
                  else np.zeros([0], dtype))  # (numpy cannot map an empty file)
    return Split(tokens, offsets)


class _RemoteTokens:
    """A remote .bin read by slices (a seek and a read each): what a memory map is for a
    local file. An open file per thread, so tf.data's threads read in parallel."""

    def __init__(self, path, dtype, length):
        self.path, self.dtype, self.length = path, dtype, length
        self._local = threading.local()

    def __len__(self):
        return self.length

    def __getitem__(self, window):
        start, stop, _ = window.indices(self.length)
        if getattr(self._local, "file", None) is None:
            self._local.file = gfile().GFile(self.path, "rb")
        self._local.file.seek(start * self.dtype.itemsize)
        return np.frombuffer(self._local.file.read(max(stop - start, 0) * self.dtype.itemsize),
                             self.dtype)


def _is_remote(path):
    return "://" in path


def gfile():
    import tensorflow as tf  # only for a remote directory: a prepare's processes need none
    return tf.io.gfile


def file_size(path):
    if _is_remote(path):
        return gfile().stat(path).length if gfile().exists(path) else None
    return os.path.getsize(path) if os.path.exists(path) else None


def _paths(directory, split):
    return os.path.join(directory, f"{split}.bin"), os.path.join(directory, f"{split}.idx")


def _read_meta(directory):
    path = os.path.join(directory, META)
    if _is_remote(path):
        return json.loads(gfile().GFile(path).read()) if gfile().exists(path) else None
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


def other_tokenizer(directory, prepared, asked):
    return (f"{directory} was prepared with the tokenizer {prepared}, but this config asks "
            f"for {asked}: prepare into another directory, or set the tokenizer it was "
            "prepared with.")
