"""A corpus as a run reads it: prepared once, again when its files change, completed
after an interruption, by one process of two, and refused with another tokenizer."""

import logging
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf

from support.lm import tiny_lm, write_corpus
from trainer.data import prepare_text, text_corpus, token_shards
from trainer.data.tokenizers import SentencePieceTokenizer


def fields(tmp_path, *text, **overrides):
    """The data and tokenizer sections of a small LM config (on `text`)."""
    config = tiny_lm(tmp_path, *text, **overrides)
    return config.data, config.tokenizer


def count_prepares(monkeypatch):
    calls = []
    real = prepare_text.prepare
    monkeypatch.setattr(prepare_text, "prepare",
                        lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    return calls


def train_documents(where, tokenizer):
    split = token_shards.open_split(where, "train", tokenizer.identity)
    return [bytes(split.document(i).astype(np.uint8)) for i in range(split.num_documents)]


def test_shards_are_prepared_once_and_again_when_a_file_changes(tmp_path, monkeypatch):
    calls = count_prepares(monkeypatch)
    data, tokenizer_config = fields(tmp_path)
    where, tokenizer = text_corpus.ready(data, tokenizer_config)
    assert text_corpus.ready(data, tokenizer_config)[0] == where and len(calls) == 1
    (tmp_path / "corpus" / "000.txt").write_bytes(b"another text")
    text_corpus.ready(data, tokenizer_config)
    assert len(calls) == 2 and train_documents(where, tokenizer) == [b"another text"]


def test_without_data_prepared_shards_live_in_the_user_cache_by_their_fields(tmp_path):
    data, tokenizer_config = fields(tmp_path, **{"data.prepared": ""})
    where, _ = text_corpus.ready(data, tokenizer_config)
    assert where.startswith(str(text_corpus.user_cache.path("tokens")))
    data.eval_fraction = 0.5  # another held-out set: other shards
    assert text_corpus.directory(data, tokenizer_config) != where


def test_an_interrupted_prepare_is_completed_by_the_next_run(tmp_path, monkeypatch):
    texts = [f"document {i}".encode() for i in range(6)]
    data, tokenizer_config = fields(tmp_path, **{
        "data.train": write_corpus(tmp_path / "docs", texts)})
    real_add = token_shards.SplitWriter.add

    def killed_after_three(writer, ids, name):
        if writer.documents == 3:
            raise KeyboardInterrupt  # as a kill in the middle of the prepare
        real_add(writer, ids, name)

    monkeypatch.setattr(token_shards.SplitWriter, "add", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        text_corpus.ready(data, tokenizer_config)
    with pytest.raises(FileNotFoundError, match="no complete 'train' split"):
        token_shards.open_split(data.prepared, "train", {})
    monkeypatch.setattr(token_shards.SplitWriter, "add", real_add)
    where, tokenizer = text_corpus.ready(data, tokenizer_config)
    assert train_documents(where, tokenizer) == texts


def test_two_runs_starting_together_prepare_once(tmp_path, monkeypatch):
    calls = count_prepares(monkeypatch)
    data, tokenizer_config = fields(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        text_corpus.ready(data, tokenizer_config, processes=1)[0])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [data.prepared] * 2 and len(calls) == 1


def test_max_bytes_takes_whole_files_in_path_order(tmp_path):
    data, tokenizer_config = fields(tmp_path, **{
        "data.train": write_corpus(tmp_path / "docs", [b"a" * 10, b"b" * 10, b"c" * 10]),
        "data.max_bytes": 15})
    where, tokenizer = text_corpus.ready(data, tokenizer_config)
    assert train_documents(where, tokenizer) == [b"a" * 10, b"b" * 10]


def test_a_sentencepiece_vocabulary_is_trained_once_and_kept_beside_the_shards(
        tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    text = open(textwrap.__file__, "rb").read()  # real text, present offline
    data, tokenizer_config = fields(tmp_path, text, **{
        "tokenizer.kind": "sentencepiece", "tokenizer.vocab_size": 500})
    trained = []
    real_train = SentencePieceTokenizer.train.__func__
    monkeypatch.setattr(SentencePieceTokenizer, "train", classmethod(
        lambda cls, *a: trained.append(1) or real_train(cls, *a)))
    where, tokenizer = text_corpus.ready(data, tokenizer_config)
    assert (tmp_path / "tokens" / text_corpus.TOKENIZER_FILE).exists()
    assert tokenizer.identity["vocab_size"] == 500
    assert text_corpus.ready(data, tokenizer_config)[1].identity == tokenizer.identity
    (tmp_path / "corpus" / "000.txt").write_bytes(text[:len(text) // 2])  # prepared again,
    assert text_corpus.ready(data, tokenizer_config)[1].identity == tokenizer.identity
    assert len(trained) == 1 and "the vocabulary trained before" in caplog.text  # not trained
    tokenizer_config.vocab_size = 600
    with pytest.raises(ValueError, match=r"tokenizer\.model has 500 pieces, but "
                                         r"tokenizer\.vocab_size=600"):
        text_corpus.ready(data, tokenizer_config)


def test_shards_of_another_tokenizer_are_refused_naming_both(tmp_path):
    data, tokenizer_config = fields(tmp_path)
    text_corpus.ready(data, tokenizer_config)
    tokenizer_config.kind = "sentencepiece"
    for _ in range(2):  # the same files, then a changed one: refused, never replaced
        with pytest.raises(ValueError, match=r"prepared with the tokenizer \{'kind': "
                                             r"'bytes'.* asks for \{'kind': 'sentencepiece'"):
            text_corpus.ready(data, tokenizer_config)
        (tmp_path / "corpus" / "000.txt").write_bytes(b"changed")
    assert token_shards.tokenizer(data.prepared)["kind"] == "bytes"


@pytest.mark.parametrize("change, error", [
    ({"tokenizer.kind": "words"}, r"tokenizer\.kind='words' is unknown"),
    ({"data.train": "/nonexistent/*.txt"}, r"data\.train='/nonexistent/\*\.txt' matches no "
                                           r"files"),
    ({"data.train": "", "data.prepared": ""}, r"data\.train is empty and data\.prepared"),
    ({"data.prepared": "gs://no-bucket/tokens"}, r"holds no shards of data\.train.*prepare "
                                                 r"them on a local disk"),
    ({"tokenizer.kind": "sentencepiece", "tokenizer.model": "/nonexistent.model"},
     r"Cannot read the SentencePiece model /nonexistent\.model"),
])
def test_bad_settings_are_named(tmp_path, monkeypatch, change, error):
    if "data.prepared" in change and change["data.prepared"]:  # no network in a test
        monkeypatch.setattr(token_shards, "inputs", lambda where: None)
        monkeypatch.setattr(token_shards, "tokenizer", lambda where: None)
    data, tokenizer_config = fields(tmp_path, **change)
    with pytest.raises((ValueError, FileNotFoundError), match=error):
        text_corpus.ready(data, tokenizer_config)


def test_a_file_that_is_no_sentencepiece_model_is_named(tmp_path):
    (tmp_path / "bad.model").write_bytes(b"not a model")
    data, tokenizer_config = fields(tmp_path, **{"tokenizer.kind": "sentencepiece",
                                                 "tokenizer.model": str(tmp_path / "bad.model")})
    with pytest.raises(ValueError, match=r"bad\.model \(tokenizer\.model\) is not a "
                                         "SentencePiece model"):
        text_corpus.ready(data, tokenizer_config)


def test_remote_shards_are_read_as_the_local_ones(tmp_path):
    """A gs:// directory is read window by window through tf.io.gfile (here TensorFlow's
    in-memory file system, ram://, stands in for it)."""
    data, tokenizer_config = fields(tmp_path)
    where, tokenizer = text_corpus.ready(data, tokenizer_config)
    remote = "ram://shards"
    tf.io.gfile.makedirs(remote)
    for name in ("meta.json", "train.bin", "train.idx", "eval.bin", "eval.idx"):
        tf.io.gfile.copy(f"{where}/{name}", f"{remote}/{name}", overwrite=True)
    local = token_shards.open_split(where, "train", tokenizer.identity)
    far = token_shards.open_split(remote, "train", tokenizer.identity)
    assert not isinstance(far.tokens, np.ndarray)
    starts = [0, 5, 700, len(local.tokens) - 40]
    np.testing.assert_array_equal(far.windows(starts, 33), local.windows(starts, 33))
    data.update(train="", prepared=remote)
    assert text_corpus.ready(data, tokenizer_config)[0] == remote
