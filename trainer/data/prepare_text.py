"""Prepare once, train many times: text files or JSONL records -> token shards.

Each text file, or each JSONL record's `text_key` field, is one document. A pool of
processes reads and tokenizes the files, a few in flight at a time, and this process
writes their documents in file order as they come (trainer/data/token_shards.py), so
memory holds the files in flight, not the corpus. Without eval files, a fixed fraction
of the documents validates, chosen by a hash of each document's text: the choice depends
neither on the order or place of the files, and a duplicated document lands in one
split. Both splits are named complete at once, at the end: a prepare interrupted at any
point is redone by the next one.
"""

import collections
import contextlib
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import time

from absl import logging

from trainer.data import token_shards

FORMATS = ("text", "jsonl")
PROGRESS_SECONDS = 10.0
IN_FLIGHT_FILES, IN_FLIGHT_BYTES = 16, 64 << 20  # per process
_WORKER_TOKENIZER = None  # a pool process's tokenizer, sent once (`_set_tokenizer`)


class BadDocument(ValueError):
    """A document that cannot be read: named, with what to do."""


def read_documents(path, fmt, text_key, skip_bad):
    """[(name, UTF-8 bytes)] of one file, and the count of bad documents skipped (each bad
    document is an error naming it unless `skip_bad`)."""
    content = read_file(path)
    if not content.strip():
        return [], _bad(f"{path} is empty", skip_bad)
    if fmt == "text":
        return [(path, content)], 0
    documents, skipped = [], 0
    for number, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue  # a blank line holds no record
        name = f"{path}:{number}"
        try:
            record = json.loads(line)
            text = record.get(text_key) if isinstance(record, dict) else None
            encoded = text.encode("utf-8") if isinstance(text, str) else None
        except (UnicodeError, json.JSONDecodeError) as e:
            skipped += _bad(f"{name} is not a JSON object of UTF-8 text ({e})", skip_bad)
            continue
        if encoded is None:
            skipped += _bad(f"{name} has no text field {text_key!r} (data.text_key)",
                            skip_bad)
        elif not encoded:
            skipped += _bad(f"{name} has an empty {text_key!r}", skip_bad)
        else:
            documents.append((name, encoded))
    return documents, skipped


def read_file(path):
    """A local or remote (gs://...) file's bytes; an error naming it."""
    try:
        if "://" in path:
            return token_shards.gfile().GFile(path, "rb").read()
        with open(path, "rb") as f:
            return f.read()
    except Exception as e:  # OSError, or TensorFlow's for a remote file
        raise BadDocument(f"Cannot read {path}: {e}") from e


def _bad(what, skip_bad):
    """1 (one document skipped), or the error that names it."""
    if not skip_bad:
        raise BadDocument(f"{what}. Fix or remove it, or set --config.data.skip_bad=True "
                          "to leave such documents out (counted in the log).")
    return 1


def document_hash(text):
    """A document's place in [0, 2**64), from its text alone."""
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def held_out(text, fraction):
    """Whether the document `text` (bytes) validates: its hash, below `fraction`."""
    return document_hash(text) < _threshold(fraction)


def _threshold(fraction):
    return int(fraction * 2**64)


def prepare(directory, train_files, eval_files, tokenizer, fmt="text", text_key="text",
            eval_fraction=0.01, skip_bad=False, processes=None, inputs=None):
    """Writes the train and eval splits of `directory` from the files of `fmt` with
    `processes` (default: the cores this process may use); returns {split: record} and
    "skipped" (the bad documents left out with `skip_bad`) and "invalid_utf8" (the
    documents kept that are not valid UTF-8: bytes keep them as they are, SentencePiece
    reads their invalid bytes as byte pieces).
    Without `eval_files`, the documents `held_out` at `eval_fraction` validate and the
    rest train; if that holds none out (a corpus of few documents), the documents with
    the lowest hash validate (a second pass). `tokenizer`: an object with `identity` (a
    dict) and `encode(bytes) -> ids`. `inputs`: what meta.json records as read
    (trainer/data/text_corpus.py compares it before preparing again)."""
    if fmt not in FORMATS:
        raise ValueError(f"data.format={fmt!r} is unknown for text; choose one of {FORMATS}.")
    if not train_files:
        raise ValueError("No training files to prepare: point data.train at text files.")
    if not eval_files and not 0 < eval_fraction < 1:
        raise ValueError(f"data.eval_fraction={eval_fraction} must be in (0, 1) without "
                         "eval files: the held-out fraction of the documents.")
    threshold = None if eval_files else _threshold(eval_fraction)
    records, progress, lowest = _write(directory, train_files, eval_files, threshold,
                                       tokenizer, fmt, text_key, skip_bad, processes)
    if not eval_files and not records["eval"]["documents"] and records["train"][
            "documents"] > 1:
        logging.warning("data.eval_fraction=%s holds out none of %d documents: the one "
                        "whose hash is lowest validates.", eval_fraction,
                        records["train"]["documents"])
        records, progress, _ = _write(directory, train_files, eval_files, lowest + 1,
                                      tokenizer, fmt, text_key, skip_bad, processes)
    for split, record in records.items():
        if not record["documents"]:
            raise ValueError(f"The {split} split has no document (data.eval_fraction="
                             f"{eval_fraction} of {records['train']['documents']} training "
                             "documents, or empty eval files): give it documents.")
    token_shards.commit(directory, records, inputs)
    progress.done(records)
    return dict(records, skipped=progress.skipped, invalid_utf8=progress.invalid)


def _write(directory, train_files, eval_files, threshold, tokenizer, fmt, text_key,
           skip_bad, processes):
    """One pass: the split records (written, not yet committed), the progress, and the
    lowest hash of a training document. Training documents hashing below `threshold`
    (None: none) validate. A failure closes and removes what it wrote."""
    jobs = [(p, threshold, False) for p in train_files] + [(p, None, True)
                                                           for p in eval_files]
    token_shards.begin(directory, ("train", "eval"), tokenizer.identity)
    writers = {s: token_shards.SplitWriter(directory, s, tokenizer.identity)
               for s in ("train", "eval")}
    sizes = [token_shards.file_size(path) or 0 for path, _, _ in jobs]
    progress, lowest = _Progress(sum(sizes)), 2**64
    try:
        with contextlib.closing(_tokenized(jobs, sizes, fmt, text_key, skip_bad, tokenizer,
                                           processes)) as results:
            for size, (documents, skipped, invalid) in zip(sizes, results):
                for name, is_eval, ids, place in documents:
                    writers["eval" if is_eval else "train"].add(ids, name)
                    lowest = lowest if is_eval else min(lowest, place)
                progress.update(size, skipped, invalid)
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    return {split: writer.close() for split, writer in writers.items()}, progress, lowest


def _tokenized(jobs, sizes, fmt, text_key, skip_bad, tokenizer, processes):
    """Each job's ([(name, is_eval, ids, hash)], skipped, invalid UTF-8), in order: in this
    process, or in spawned processes (this process may run TensorFlow's threads, which a
    fork would copy mid-flight). In flight: at most IN_FLIGHT_FILES files a process, and
    IN_FLIGHT_BYTES of them a process (or one file): enough that a large file does not
    leave the others idle, bounded whatever the corpus. A process that dies (killed, out
    of memory) ends the prepare with BrokenProcessPool, not a hang."""
    processes = min(processes or len(os.sched_getaffinity(0)), len(jobs))
    if processes <= 1:
        _set_tokenizer(tokenizer)
        yield from (_tokenize(job, fmt, text_key, skip_bad) for job in jobs)
        return
    pool = concurrent.futures.ProcessPoolExecutor(
        processes, mp_context=multiprocessing.get_context("spawn"),
        initializer=_set_tokenizer, initargs=(tokenizer,))
    try:
        pending, in_flight = collections.deque(), 0
        for job, size in zip(jobs, sizes):
            while pending and (len(pending) >= IN_FLIGHT_FILES * processes
                               or in_flight + size > IN_FLIGHT_BYTES * processes):
                done_size, future = pending.popleft()
                in_flight -= done_size
                yield _result(future)
            pending.append((size, pool.submit(_tokenize, job, fmt, text_key, skip_bad)))
            in_flight += size
        while pending:
            yield _result(pending.popleft()[1])
    finally:  # (also when the prepare fails: the files not yet started are dropped)
        pool.shutdown(wait=True, cancel_futures=True)


def _result(future):
    """A worker's result; its error about a document raised again here, where the
    command line tells it in one line (it shows a traceback for errors inside
    libraries, as concurrent.futures' re-raise is)."""
    try:
        return future.result()
    except ValueError as e:  # BadDocument, an id outside the vocabulary
        raise BadDocument(str(e)) from None


def _set_tokenizer(tokenizer):
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def _tokenize(job, fmt, text_key, skip_bad):
    path, threshold, is_eval = job
    documents, skipped = read_documents(path, fmt, text_key, skip_bad)
    tokenized = []
    vocab_size = _WORKER_TOKENIZER.identity["vocab_size"]
    for name, text in documents:
        place = document_hash(text)
        ids = token_shards.checked_ids(_WORKER_TOKENIZER.encode(text), vocab_size, name)
        tokenized.append((name, is_eval or (threshold is not None and place < threshold),
                          ids, place))  # (ids in the shard's dtype: 4x less to send back)
    return tokenized, skipped, sum(not valid_utf8(text) for _, text in documents)


def valid_utf8(text):
    try:
        text.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class _Progress:
    """Logs MB/s and an ETA every PROGRESS_SECONDS, and the counts at the end."""

    def __init__(self, total):
        self.total, self.read, self.skipped, self.invalid = total, 0, 0, 0
        self.start = self.last = time.monotonic()

    def update(self, size, skipped, invalid):
        self.read, self.skipped = self.read + size, self.skipped + skipped
        self.invalid += invalid
        now = time.monotonic()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            rate = self.read / max(now - self.start, 1e-9)
            logging.info("Preparing: %.1f of %.1f MB, %.1f MB/s, ETA %.0f s.",
                         self.read / 1e6, self.total / 1e6, rate / 1e6,
                         (self.total - self.read) / max(rate, 1e-9))

    def done(self, records):
        seconds = time.monotonic() - self.start
        logging.info("Prepared %s from %.1f MB in %.1f s (%.1f MB/s)%s.", "; ".join(
            f"{s}: {r['documents']} documents, {r['tokens']} tokens"
            for s, r in records.items()), self.total / 1e6, seconds,
            self.total / 1e6 / max(seconds, 1e-9),
            f"; {self.skipped} bad documents left out (data.skip_bad)" if self.skipped
            else "")
        if self.invalid:
            logging.warning("%d documents are not valid UTF-8: their invalid bytes are kept "
                            "as bytes (byte pieces for SentencePiece).", self.invalid)
