"""Prepare once, train many times: text files or JSONL records -> token shards.

Each text file, or each JSONL record's `text_key` field, is one document. The files are
read and tokenized by a pool of processes, in file order, and written as they come
(trainer/data/token_shards.py), so memory holds the files in flight, not the corpus.
Without eval files, a fixed fraction of the documents validates, chosen by a hash of each
document's name (its path below the files' common folder, with :line for JSONL), so the
choice depends neither on the order files are read in nor on where the corpus lies. A
split is named complete only when written: a prepare interrupted at any point is redone
by the next one. (Wiring into the LM task, SentencePiece and the `prepare` mode come next:
issue 40.)
"""

import contextlib
import hashlib
import json
import multiprocessing
import os
import time

from absl import logging

from trainer.data import token_shards

FORMATS = ("text", "jsonl")
PROGRESS_SECONDS = 10.0


class BadDocument(ValueError):
    """A document that cannot be read: named, with what to do."""


def read_documents(path, fmt, text_key, skip_bad):
    """[(name, UTF-8 bytes)] of one file, and the count of bad documents skipped (each bad
    document is an error naming it unless `skip_bad`)."""
    with open(path, "rb") as f:
        content = f.read()
    if fmt == "text":
        if content:
            return [(path, content)], 0
        return _bad(f"{path} is empty", skip_bad, [])
    documents, skipped = [], 0
    for number, line in enumerate(content.splitlines(), 1):
        name = f"{path}:{number}"
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            skipped += _bad(f"{name} is not a JSON object of UTF-8 text ({e})", skip_bad)
            continue
        text = record.get(text_key) if isinstance(record, dict) else None
        if not isinstance(text, str):
            skipped += _bad(f"{name} has no text field {text_key!r} (data.text_key)",
                            skip_bad)
        elif not text:
            skipped += _bad(f"{name} has an empty {text_key!r}", skip_bad)
        else:
            documents.append((name, text.encode("utf-8")))
    return documents, skipped


def _bad(what, skip_bad, documents=None):
    if not skip_bad:
        raise BadDocument(f"{what}. Fix or remove it, or set --config.data.skip_bad=True "
                          "to leave such documents out (counted in the log).")
    return (documents, 1) if documents is not None else 1


def held_out(name, fraction):
    """Whether document `name` validates: a stable hash of its name, below `fraction`."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "little") < fraction * 2**64


def prepare(directory, train_files, eval_files, tokenizer, fmt="text", text_key="text",
            eval_fraction=0.01, skip_bad=False, processes=None):
    """Writes the train and eval splits of `directory` from the files of `fmt` with
    `processes` (default: every core); returns {split: record}. Without `eval_files`,
    the documents `held_out` at `eval_fraction` validate and the rest train.
    `tokenizer`: an object with `identity` (a dict) and `encode(bytes) -> ids`."""
    if fmt not in FORMATS:
        raise ValueError(f"data.format={fmt!r} is unknown for text; choose one of {FORMATS}.")
    routed = None if eval_files else eval_fraction  # eval: held-out train documents
    processes = processes or os.cpu_count()
    root = os.path.commonpath(train_files) if len(train_files) > 1 else os.path.dirname(
        train_files[0])  # names are hashed from here: a moved corpus holds out the same
    # Spawned, not forked: this process may run TensorFlow's threads. One process needs
    # no pool (a spawned worker starts by importing the framework, seconds).
    with (multiprocessing.get_context("spawn").Pool(processes) if processes > 1
          else contextlib.nullcontext()) as pool:
        records = {}
        for split in ("train", "eval"):
            files = eval_files if split == "eval" and eval_files else train_files
            progress = _Progress(split, sum(os.path.getsize(p) for p in files))
            tokenize = _Tokenize(split, fmt, text_key, skip_bad, routed, tokenizer, root)
            tokenized = pool.imap(tokenize, files) if pool else map(tokenize, files)
            records[split] = token_shards.write_split(
                directory, split, _documents(tokenized, progress), tokenizer.identity)
            records[split]["skipped"] = progress.skipped
            progress.done(records[split])
    return records


def _documents(tokenized, progress):
    for ids_list, skipped, size in tokenized:
        progress.update(size, skipped)
        yield from ids_list


class _Tokenize:
    """Reads one file and tokenizes its documents of `split` (a pool's task). With
    `routed` (a fraction), a document is in eval exactly when `held_out` says so of its
    name below `root`."""

    def __init__(self, split, fmt, text_key, skip_bad, routed, tokenizer, root):
        self.split, self.fmt, self.text_key = split, fmt, text_key
        self.skip_bad, self.routed, self.tokenizer = skip_bad, routed, tokenizer
        self.root = root

    def __call__(self, path):
        documents, skipped = read_documents(path, self.fmt, self.text_key, self.skip_bad)
        ids = [self.tokenizer.encode(text) for name, text in documents
               if self.routed is None
               or held_out(os.path.relpath(name, self.root), self.routed)
               == (self.split == "eval")]
        return ids, skipped, os.path.getsize(path)


class _Progress:
    """Logs MB/s and an ETA every PROGRESS_SECONDS."""

    def __init__(self, split, total):
        self.split, self.total, self.read, self.skipped = split, total, 0, 0
        self.start = self.last = time.monotonic()

    def update(self, size, skipped):
        self.read, self.skipped = self.read + size, self.skipped + skipped
        now = time.monotonic()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            rate = self.read / max(now - self.start, 1e-9)
            logging.info("Preparing %s: %.1f of %.1f MB, %.1f MB/s, ETA %.0f s.", self.split,
                         self.read / 1e6, self.total / 1e6, rate / 1e6,
                         (self.total - self.read) / max(rate, 1e-9))

    def done(self, record):
        seconds = time.monotonic() - self.start
        logging.info("Prepared %s: %d documents, %d tokens from %.1f MB in %.1f s "
                     "(%.1f MB/s)%s.", self.split, record["documents"], record["tokens"],
                     self.total / 1e6, seconds, self.total / 1e6 / max(seconds, 1e-9),
                     f"; {self.skipped} bad documents skipped (data.skip_bad)"
                     if self.skipped else "")
