"""A text corpus as a training run reads it: the token shards of `data.prepared`,
prepared from `data.train` / `data.eval` with the tokenizer the config names, once.

`ready(data, tokenizer_config)` finds the shards, or prepares them (under a lock, so
two processes preparing the same directory prepare it once), and returns them with
their tokenizer. Shards are current when they were made from the same files (paths,
sizes, modification times) with the same settings and tokenizer: a changed corpus is
prepared again, never read stale. Without `data.prepared` they live in the user cache,
`$XDG_CACHE_HOME/tftrainer/tokens/<a hash of the data and tokenizer fields>`, so every
run of one corpus shares them.
"""

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import sysconfig
import time

from absl import logging

from trainer.data import prepare_text, token_shards
from trainer.data.tokenizers import ByteTokenizer, SentencePieceTokenizer
from trainer.runtime import user_cache

TOKENIZER_FILE = "tokenizer.model"  # a SentencePiece model trained at prepare time
KINDS = ("bytes", "sentencepiece")


def corpus_files(pattern, field="data.train"):
    """Sorted files of a glob. `stdlib` = the running Python's standard library .py files
    that hold text (present offline), without the third-party packages installed beneath
    it. A local
    pattern may use `**`; a remote one (gs://...) is matched by tf.io.gfile.glob."""
    stdlib = pattern == "stdlib"
    if stdlib:
        pattern = os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py")
    if "://" in pattern:
        gfile = token_shards.gfile()
        matches = [f for f in gfile.glob(pattern) if not gfile.isdir(f)]
    else:
        matches = [f for f in glob.glob(os.path.expanduser(pattern), recursive=True)
                   if os.path.isfile(f)]
    files = sorted(f for f in matches if not (stdlib and ("-packages" + os.sep in f
                                                          or not os.path.getsize(f))))
    if not files:
        raise FileNotFoundError(f"{field}={pattern!r} matches no files; point "
                                f"--config.{field} at a glob of text files.")
    return files


def directory(data, tokenizer_config):
    """Where the shards are: data.prepared, or a directory of the user cache named by the
    fields that decide them."""
    if data.prepared:
        return os.path.expanduser(data.prepared)
    fields = {k: data[k] for k in ("train", "eval", "format", "text_key", "eval_fraction",
                                   "skip_bad", "max_bytes")}
    fields["tokenizer"] = tokenizer_config.to_dict()
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return user_cache.path(os.path.join("tokens", key))


def ready(data, tokenizer_config, processes=None):
    """(directory, tokenizer) of current shards for the config, prepared first if
    needed. With data.train empty, data.prepared is read as it is."""
    if tokenizer_config.kind not in KINDS:
        raise ValueError(f"tokenizer.kind={tokenizer_config.kind!r} is unknown; choose "
                         f"one of {KINDS}.")
    where = directory(data, tokenizer_config)
    if not data.train:
        if not data.prepared:
            raise ValueError("data.train is empty and data.prepared names no shards: set "
                             "one of them.")
        _check_kind(where, tokenizer_config)
        return where, _tokenizer(where, tokenizer_config, train_documents=None)
    inputs = _inputs(data)
    _check_kind(where, tokenizer_config)  # current or not: never replaced by another kind
    if token_shards.inputs(where) == inputs:
        return where, _tokenizer(where, tokenizer_config, train_documents=None)
    if "://" in where:
        raise ValueError(f"{where} (data.prepared) holds no shards of data.train="
                         f"{data.train!r}: prepare them on a local disk (--mode=prepare "
                         "with a local data.prepared), then copy the directory there.")
    with _prepare_lock(where):
        _check_kind(where, tokenizer_config)
        if token_shards.inputs(where) == inputs:  # another process prepared them meanwhile
            return where, _tokenizer(where, tokenizer_config, train_documents=None)
        logging.info("Preparing token shards of data.train=%r in %s.", data.train, where)
        train_files = [path for path, _, _ in inputs["train"]]
        tokenizer = _tokenizer(where, tokenizer_config, train_documents=(
            lambda: _sample(train_files, data, tokenizer_config.train_sample_bytes)))
        prepared = token_shards.tokenizer(where)
        if prepared and prepared != tokenizer.identity:  # (another model of one kind)
            raise ValueError(token_shards.other_tokenizer(where, prepared, tokenizer.identity))
        prepare_text.prepare(
            where, train_files, [path for path, _, _ in inputs["eval"]], tokenizer,
            fmt=data.format, text_key=data.text_key, eval_fraction=data.eval_fraction,
            skip_bad=data.skip_bad, processes=processes, inputs=inputs)
    return where, tokenizer


def _check_kind(where, tokenizer_config):
    """Shards made with another kind of tokenizer are refused, naming both, rather than
    read or replaced (open_split compares the whole identity once the tokenizer is
    loaded; a SentencePiece vocabulary kept beside them is checked against
    tokenizer.vocab_size)."""
    prepared = token_shards.tokenizer(where)
    if prepared and prepared["kind"] != tokenizer_config.kind:
        raise ValueError(token_shards.other_tokenizer(where, prepared,
                                                      tokenizer_config.to_dict()))


def _inputs(data):
    """What the shards are made of: the files (path, size, modification time) and the
    settings that change what is read."""
    train = _stat(corpus_files(data.train, "data.train"))
    if data.max_bytes:  # whole files, in path order, up to max_bytes
        total, kept = 0, []
        for entry in train:
            if total >= data.max_bytes:
                break
            kept.append(entry)
            total += entry[1]
        train = kept
    return {"train": train,
            "eval": _stat(corpus_files(data.eval, "data.eval")) if data.eval else [],
            **{k: data[k] for k in ("format", "text_key", "eval_fraction", "skip_bad")}}


def _stat(paths):
    if paths and "://" in paths[0]:
        stats = [token_shards.gfile().stat(p) for p in paths]
        return [[p, s.length, s.mtime_nsec] for p, s in zip(paths, stats)]
    return [[p, s.st_size, s.st_mtime_ns] for p, s in ((p, os.stat(p)) for p in paths)]


def _tokenizer(where, tokenizer_config, train_documents):
    """The config's tokenizer. A SentencePiece model without tokenizer.model is the one
    beside the shards, trained on `train_documents()` if there is none (and they are
    given)."""
    if tokenizer_config.kind == "bytes":
        return ByteTokenizer()
    if tokenizer_config.model:
        return SentencePieceTokenizer.load(os.path.expanduser(tokenizer_config.model),
                                           read=prepare_text.read_file)
    path = os.path.join(where, TOKENIZER_FILE)
    if token_shards.file_size(path) is not None:
        tokenizer = SentencePieceTokenizer.load(path, read=prepare_text.read_file)
        if train_documents is not None:
            logging.info("Preparing with the vocabulary trained before, %s (delete it to "
                         "train another on this corpus).", path)
        if tokenizer.identity["vocab_size"] != tokenizer_config.vocab_size:
            raise ValueError(
                f"{path} has {tokenizer.identity['vocab_size']} pieces, but "
                f"tokenizer.vocab_size={tokenizer_config.vocab_size}: set that, or "
                "prepare into another data.prepared to train a new vocabulary.")
        return tokenizer
    if train_documents is None:
        raise FileNotFoundError(f"{where} holds no {TOKENIZER_FILE} and tokenizer.model "
                                "is empty: prepare the shards (--mode=prepare), or name the "
                                "model they were made with.")
    start = time.monotonic()
    tokenizer = SentencePieceTokenizer.train(train_documents(), tokenizer_config.vocab_size)
    os.makedirs(where, exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(tokenizer.model_proto)
    os.replace(path + ".tmp", path)
    logging.info("Trained a SentencePiece vocabulary of %d pieces in %.1f s: %s.",
                 tokenizer_config.vocab_size, time.monotonic() - start, path)
    return tokenizer


def _sample(train_files, data, budget):
    """Training documents to learn a vocabulary from: whole files in an order fixed by a
    hash of their paths (spread over the corpus, not its first folder), up to `budget`
    bytes; no held-out document."""
    fraction = None if data.eval else data.eval_fraction
    taken = 0
    for path in sorted(train_files, key=lambda p: hashlib.sha256(p.encode()).digest()):
        documents, _ = prepare_text.read_documents(path, data.format, data.text_key,
                                                   skip_bad=True)
        for _, text in documents:
            if fraction is not None and prepare_text.held_out(text, fraction):
                continue
            yield text
            taken += len(text)
            if taken >= budget:
                return


@contextlib.contextmanager
def _prepare_lock(where):
    """One process prepares `where` at a time: the others wait, then find it done. The
    kernel drops the lock when its holder dies."""
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "prepare.lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logging.info("Waiting for another process preparing %s.", where)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
