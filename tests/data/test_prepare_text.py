"""Preparing text: every document lands in its split exactly, bad documents are named
(or counted with data.skip_bad), and an interrupted prepare is redone."""

import itertools
import json
import os

import numpy as np
import pytest

from trainer.data import token_shards
from trainer.data.prepare_text import BadDocument, held_out, prepare
from trainer.data.tokenizers import ByteTokenizer

BYTES = ByteTokenizer.identity


def write_texts(folder, texts):
    folder.mkdir(exist_ok=True)
    paths = []
    for i, text in enumerate(texts):
        paths.append(str(folder / f"{i:03d}.txt"))
        with open(paths[-1], "wb") as f:
            f.write(text)
    return paths


def documents(directory, split):
    read = token_shards.open_split(str(directory), split, BYTES)
    return [bytes(read.document(i).astype(np.uint8)) for i in range(read.num_documents)]


def test_text_files_are_documents_in_file_order(tmp_path):
    train = [b"first\n", "caf\u00e9 \u2603".encode(), b"\xff\xfe not UTF-8 \x80"]
    evaluated = [b"held out"]
    records = prepare(str(tmp_path / "out"), write_texts(tmp_path / "train", train),
                      write_texts(tmp_path / "eval", evaluated), ByteTokenizer(),
                      processes=1)
    assert documents(tmp_path / "out", "train") == train  # bytes keep every byte
    assert documents(tmp_path / "out", "eval") == evaluated
    assert records["train"]["tokens"] == sum(map(len, train))


def test_without_eval_files_a_fixed_fraction_of_documents_validates(tmp_path):
    texts = [f"document {i}".encode() for i in range(40)]
    paths = write_texts(tmp_path / "train", texts)
    prepare(str(tmp_path / "a"), paths, [], ByteTokenizer(), eval_fraction=0.25, processes=1)
    train, held = documents(tmp_path / "a", "train"), documents(tmp_path / "a", "eval")
    assert sorted(train + held) == sorted(texts) and not set(train) & set(held)
    assert held == [t for t, p in zip(texts, paths) if held_out(os.path.basename(p), 0.25)]
    assert 0 < len(held) < 20
    moved = write_texts(tmp_path / "elsewhere", texts)[::-1]  # another folder and order
    prepare(str(tmp_path / "b"), moved, [], ByteTokenizer(), eval_fraction=0.25, processes=1)
    assert sorted(documents(tmp_path / "b", "eval")) == sorted(held)


@pytest.mark.parametrize("line, problem", [
    (b"{not json", r"data\.jsonl:2 is not a JSON object"),
    (b'{"body": "x"}', r"data\.jsonl:2 has no text field 'text'"),
    (b'{"text": ""}', r"data\.jsonl:2 has an empty 'text'"),
    (b'{"text": "\xff"}', r"data\.jsonl:2 is not a JSON object of UTF-8 text"),
])
def test_a_bad_jsonl_record_is_named_or_counted_with_skip_bad(tmp_path, line, problem):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"text": "good one"}\n' + line + b'\n{"text": "good two"}\n')
    with pytest.raises(BadDocument, match=problem + r".*data\.skip_bad=True"):
        prepare(str(tmp_path / "out"), [str(path)], [str(path)], ByteTokenizer(),
                fmt="jsonl", processes=1)
    records = prepare(str(tmp_path / "out"), [str(path)], [str(path)], ByteTokenizer(),
                      fmt="jsonl", skip_bad=True, processes=1)
    assert documents(tmp_path / "out", "train") == [b"good one", b"good two"]
    assert records["train"]["skipped"] == 1


def test_an_empty_text_file_is_named(tmp_path):
    paths = write_texts(tmp_path / "train", [b"text", b""])
    with pytest.raises(BadDocument, match=r"001\.txt is empty"):
        prepare(str(tmp_path / "out"), paths, paths[:1], ByteTokenizer(), processes=1)


class FailsOnce(ByteTokenizer):
    """Breaks on the document "boom", as a kill in the middle of a prepare would."""

    @staticmethod
    def encode(text):
        if text == b"boom":
            raise RuntimeError("interrupted")
        return ByteTokenizer.encode(text)


@pytest.mark.e2e  # a pool of processes
def test_an_interrupted_prepare_leaves_no_complete_split_and_a_rerun_completes(tmp_path):
    """Two processes (a pool): the documents keep the files' order."""
    paths = write_texts(tmp_path / "train", [b"one", b"boom", b"three"])
    out = str(tmp_path / "out")
    with pytest.raises(RuntimeError, match="interrupted"):
        prepare(out, paths, paths[:1], FailsOnce(), processes=2)
    with pytest.raises(FileNotFoundError, match="no complete 'train' split"):
        token_shards.open_split(out, "train", BYTES)
    prepare(out, paths, paths[:1], ByteTokenizer(), processes=2)
    assert documents(out, "train") == [b"one", b"boom", b"three"]
    assert json.load(open(tmp_path / "out" / "meta.json"))["splits"]["eval"]["documents"] == 1


def test_a_sentencepiece_model_trained_here_keeps_every_character(tmp_path):
    """Byte fallback: text outside the vocabulary comes back exactly; the shards are
    uint16 ids, and another model's shards are refused."""
    from trainer.data.tokenizers import SentencePieceTokenizer
    words = ["".join(w) for w in itertools.product("bcdfgklmnp", "aeiou", "rst")]  # 150
    texts = [" ".join(words[(7 * i + 11 * j) % 150] for j in range(60)).encode()
             for i in range(40)]
    tokenizer = SentencePieceTokenizer.train(texts, vocab_size=300)
    assert tokenizer.identity["vocab_size"] == 300
    unseen = "na\u00efve \u2603 \U0001F600 42".encode()
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
