"""Preparing text: every document lands in one split exactly, bad documents are named
(or counted with data.skip_bad), and an interrupted prepare leaves nothing complete."""

import itertools
import json

import numpy as np
import pytest

from trainer.data import token_shards
from trainer.data.prepare_text import BadDocument, document_hash, held_out, prepare
from trainer.data.tokenizers import ByteTokenizer, SentencePieceTokenizer

BYTES = ByteTokenizer.identity


def write_texts(folder, texts):
    folder.mkdir(exist_ok=True)
    paths = []
    for i, text in enumerate(texts):
        paths.append(str(folder / f"{i:03d}.txt"))
        with open(paths[-1], "wb") as f:
            f.write(text)
    return paths


def documents(directory, split, tokenizer=BYTES):
    read = token_shards.open_split(str(directory), split, tokenizer)
    return [bytes(read.document(i).astype(np.uint8)) for i in range(read.num_documents)]


def test_text_files_are_documents_in_file_order(tmp_path):
    train = [b"first\n", "caf\u00e9 \u2603".encode(), b"\xff\xfe not UTF-8 \x80"]
    evaluated = [b"held out"]
    records = prepare(str(tmp_path / "out"), write_texts(tmp_path / "train", train),
                      write_texts(tmp_path / "eval", evaluated), ByteTokenizer(),
                      processes=1)
    assert documents(tmp_path / "out", "train") == train  # bytes keep every byte
    assert documents(tmp_path / "out", "eval") == evaluated
    assert records["train"]["tokens"] == sum(map(len, train)) + len(train)  # + separators


def test_without_eval_files_a_fixed_fraction_of_documents_validates(tmp_path):
    texts = [f"document {i}".encode() for i in range(40)] + [b"document 3"]  # a duplicate
    paths = write_texts(tmp_path / "train", texts)
    prepare(str(tmp_path / "a"), paths, [], ByteTokenizer(), eval_fraction=0.25, processes=1)
    train, held = documents(tmp_path / "a", "train"), documents(tmp_path / "a", "eval")
    assert sorted(train + held) == sorted(texts)
    assert held == [t for t in texts if held_out(t, 0.25)] and not set(train) & set(held)
    assert 0 < len(held) < 20
    moved = write_texts(tmp_path / "elsewhere", texts)[::-1]  # another folder and order
    prepare(str(tmp_path / "b"), moved, [], ByteTokenizer(), eval_fraction=0.25, processes=1)
    assert sorted(documents(tmp_path / "b", "eval")) == sorted(held)


@pytest.mark.parametrize("line, problem", [
    (b"{not json", r"data\.jsonl:2 is not a JSON object"),
    (b'{"body": "x"}', r"data\.jsonl:2 has no text field 'text'"),
    (b'{"text": ""}', r"data\.jsonl:2 has an empty 'text'"),
    (b'{"text": "\xff"}', r"data\.jsonl:2 is not a JSON object of UTF-8 text"),
    (b'{"text": "\\ud800"}', r"data\.jsonl:2 is not a JSON object of UTF-8 text"),
])
def test_a_bad_jsonl_record_is_named_or_counted_with_skip_bad(tmp_path, line, problem):
    path, held = tmp_path / "data.jsonl", tmp_path / "held.jsonl"
    path.write_bytes(b'{"text": "good one"}\n' + line + b'\n\n{"text": "good two"}\n')
    held.write_bytes(b'{"text": "held"}\n')
    with pytest.raises(BadDocument, match=problem + r".*data\.skip_bad=True"):
        prepare(str(tmp_path / "out"), [str(path)], [str(held)], ByteTokenizer(),
                fmt="jsonl", processes=1)
    records = prepare(str(tmp_path / "out"), [str(path)], [str(held)], ByteTokenizer(),
                      fmt="jsonl", skip_bad=True, processes=1)
    assert documents(tmp_path / "out", "train") == [b"good one", b"good two"]
    assert documents(tmp_path / "out", "eval") == [b"held"] and records["skipped"] == 1


@pytest.mark.parametrize("fmt, content", [("text", b""), ("jsonl", b"\n  \n")])
def test_an_empty_file_is_named_or_counted(tmp_path, fmt, content):
    paths = write_texts(tmp_path / "train", [b'{"text": "a"}', content])
    with pytest.raises(BadDocument, match=r"001\.txt is empty"):
        prepare(str(tmp_path / "out"), paths, paths[:1], ByteTokenizer(), fmt, processes=1)
    records = prepare(str(tmp_path / "out"), paths, paths[:1], ByteTokenizer(), fmt,
                      skip_bad=True, processes=1)
    assert records["skipped"] == 1 and records["train"]["documents"] == 1


def test_a_fraction_that_holds_out_nothing_holds_out_the_lowest_hash(tmp_path, caplog):
    texts = [f"file {i}".encode() for i in range(5)]
    assert not any(held_out(t, 0.01) for t in texts)
    records = prepare(str(tmp_path / "out"), write_texts(tmp_path / "train", texts), [],
                      ByteTokenizer(), eval_fraction=0.01, processes=1)
    assert documents(tmp_path / "out", "eval") == [min(texts, key=document_hash)]
    assert records["train"]["documents"] == 4
    assert "holds out none of 5 documents" in caplog.text


@pytest.mark.parametrize("train, fraction, problem", [
    ([], 0.1, "No training files"),
    ([b"a", b"b"], 1.5, r"eval_fraction=1\.5 must be in \(0, 1\)"),
    ([b"only one"], 0.01, "The eval split has no document"),
])
def test_a_prepare_that_cannot_give_two_splits_is_refused(tmp_path, train, fraction, problem):
    paths = write_texts(tmp_path / "train", train) if train else []
    with pytest.raises(ValueError, match=problem):
        prepare(str(tmp_path / "out"), paths, [], ByteTokenizer(), eval_fraction=fraction,
                processes=1)


class FailsOnBoom(ByteTokenizer):
    """Breaks on the document "boom", as a kill in the middle of a prepare would."""

    @staticmethod
    def encode(text):
        if text == b"boom":
            raise RuntimeError("interrupted")
        return ByteTokenizer.encode(text)


@pytest.mark.e2e  # a pool of processes
def test_an_interrupted_prepare_leaves_no_split_complete_and_a_rerun_completes(tmp_path):
    """Over a complete directory, in two processes: the documents keep the files' order."""
    out = str(tmp_path / "out")
    first = write_texts(tmp_path / "first", [b"old one", b"old two"])
    prepare(out, first, first[:1], ByteTokenizer(), processes=1)
    paths = write_texts(tmp_path / "train", [b"one", b"boom", b"three", b"four"])
    with pytest.raises(RuntimeError, match="interrupted"):
        prepare(out, paths, paths[:1], FailsOnBoom(), processes=2)
    for split in ("train", "eval"):  # no mix of the old eval and a new train
        with pytest.raises(FileNotFoundError, match=f"no complete '{split}' split"):
            token_shards.open_split(out, split, BYTES)
    prepare(out, paths, paths[:1], ByteTokenizer(), processes=2)
    assert documents(out, "train") == [b"one", b"boom", b"three", b"four"]
    with open(tmp_path / "out" / "meta.json") as f:
        assert json.load(f)["splits"]["eval"]["documents"] == 1


def sentencepiece_texts():
    words = ["".join(w) for w in itertools.product("bcdfgklmnp", "aeiou", "rst")]  # 150
    return [(" ".join(words[(7 * i + 11 * j) % 150] for j in range(60)) + "\n\n  x").encode()
            for i in range(40)]


def test_a_sentencepiece_model_trained_here_keeps_every_character(tmp_path):
    """Byte fallback and no normalization: text outside the vocabulary, newlines and
    runs of spaces come back exactly; the shards are uint16 ids, and another model's
    shards are refused."""
    texts = sentencepiece_texts()
    tokenizer = SentencePieceTokenizer.train(texts, vocab_size=300)
    assert tokenizer.identity["vocab_size"] == 300
    unseen = "na\u00efve \u2603 \U0001F600 42\n\n  two  spaces\tand \uff46".encode()
    assert tokenizer.decode(tokenizer.encode(unseen)) == unseen.decode()
    assert SentencePieceTokenizer.train(texts, 300).identity == tokenizer.identity

    paths = write_texts(tmp_path / "train", texts + [unseen])
    prepare(str(tmp_path / "out"), paths, paths[:2], tokenizer, processes=1)
    read = token_shards.open_split(str(tmp_path / "out"), "train", tokenizer.identity)
    assert read.tokens.dtype == np.uint16 and read.num_documents == 41
    assert tokenizer.decode(read.document(40)) == unseen.decode()
    other = SentencePieceTokenizer.train(texts[:20], vocab_size=280)
    with pytest.raises(ValueError, match="prepared with the tokenizer"):
        token_shards.open_split(str(tmp_path / "out"), "train", other.identity)


@pytest.mark.parametrize("tokenizer", ["bytes", "sentencepiece"])
def test_invalid_utf8_is_kept_as_bytes_and_counted(tmp_path, caplog, tokenizer):
    texts = sentencepiece_texts()
    tokenizer = (ByteTokenizer() if tokenizer == "bytes"
                 else SentencePieceTokenizer.train(texts, vocab_size=300))
    broken = b"valid \xc3\xa9, then \xff\xfe and a cut \xe2\x98"
    paths = write_texts(tmp_path / "train", texts[:5] + [broken, broken + b"!"])
    records = prepare(str(tmp_path / "out"), paths, paths[:1], tokenizer, processes=1)
    assert records["invalid_utf8"] == 2
    assert "2 documents are not valid UTF-8" in caplog.text
    read = token_shards.open_split(str(tmp_path / "out"), "train", tokenizer.identity)
    ids = read.document(5)
    assert tokenizer.token_bytes()[ids].sum() == len(broken)  # every byte counted
    if tokenizer.identity["kind"] == "bytes":
        assert bytes(ids.astype(np.uint8)) == broken
    else:  # the invalid bytes as byte pieces
        pieces = [tokenizer.processor.id_to_piece(int(i)) for i in ids]
        assert [p for p in pieces if p.startswith("<0x")][-4:] == [
            "<0xFF>", "<0xFE>", "<0xE2>", "<0x98>"]


@pytest.mark.e2e  # a pool of processes
def test_a_sentencepiece_prepare_in_a_pool_equals_one_in_this_process(tmp_path):
    texts = sentencepiece_texts()
    tokenizer = SentencePieceTokenizer.train(texts, vocab_size=300)
    paths = write_texts(tmp_path / "train", texts)
    prepare(str(tmp_path / "one"), paths, paths[:2], tokenizer, processes=1)
    prepare(str(tmp_path / "two"), paths, paths[:2], tokenizer, processes=2)
    for name in ("train.bin", "train.idx", "eval.bin"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


@pytest.mark.e2e  # a pool of processes
def test_a_bad_document_found_by_a_pool_process_is_told_in_one_line(tmp_path):
    """Raised again where the command line tells it without a traceback (it shows one for
    an error that ends inside a library, as concurrent.futures' re-raise does)."""
    from trainer.cli import raised_here
    paths = write_texts(tmp_path / "train", [b"fine", b"also fine", b"  \n", b"more"])
    with pytest.raises(BadDocument, match=r"002\.txt is empty") as caught:
        prepare(str(tmp_path / "out"), paths, paths[:1], ByteTokenizer(), processes=2)
    assert raised_here(caught.value)
