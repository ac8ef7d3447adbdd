"""Token shards: what a prepare writes is read back exactly by memory map, and a split
that is incomplete, truncated or made by another tokenizer never reads as usable."""

import os

import numpy as np
import pytest

from trainer.data import token_shards

BYTES = {"kind": "bytes", "vocab_size": 257, "separator": 256}
DOCUMENTS = [np.array([1, 2, 3]), np.array([], np.int64), np.arange(250, 256)]


def write(directory, splits, tokenizer=BYTES):
    """{split: documents} written and committed, as a prepare does."""
    token_shards.begin(str(directory), tuple(splits), tokenizer)
    records = {}
    for split, documents in splits.items():
        writer = token_shards.SplitWriter(str(directory), split, tokenizer)
        for i, document in enumerate(documents):
            writer.add(document, f"document {i}")
        records[split] = writer.close()
    token_shards.commit(str(directory), records)
    return records


def test_documents_are_read_back_exactly_by_memory_map(tmp_path):
    records = write(tmp_path, {"train": DOCUMENTS})
    assert records["train"]["documents"] == 3 and records["train"]["tokens"] == 3 + 9
    split = token_shards.open_split(str(tmp_path), "train", BYTES)
    assert isinstance(split.tokens, np.memmap) and split.tokens.dtype == np.uint16
    assert isinstance(split.offsets, np.memmap) and split.num_documents == 3
    for i, document in enumerate(DOCUMENTS):
        np.testing.assert_array_equal(split.document(i), document)
    # packed, a separator before each document
    np.testing.assert_array_equal(split.tokens, [256, 1, 2, 3, 256, 256, *range(250, 256)])
    assert os.path.getsize(tmp_path / "train.bin") == 12 * 2


@pytest.mark.parametrize("vocab_size, dtype", [(65_536, np.uint16), (65_537, np.uint32)])
def test_ids_are_uint16_while_the_vocabulary_fits(tmp_path, vocab_size, dtype):
    tokenizer = {"kind": "sentencepiece", "vocab_size": vocab_size, "separator": 2}
    top = np.array([0, vocab_size - 1])
    write(tmp_path, {"train": [top]}, tokenizer)
    split = token_shards.open_split(str(tmp_path), "train", tokenizer)
    assert split.tokens.dtype == dtype
    np.testing.assert_array_equal(split.document(0), top)


def test_an_id_outside_the_vocabulary_is_refused_naming_the_document(tmp_path):
    with pytest.raises(ValueError, match=r"document 1: a token id is outside \[0, 257\)"):
        write(tmp_path, {"train": [np.array([1]), np.array([257])]})


def test_an_interrupted_rewrite_leaves_every_split_incomplete_and_old_readers_whole(
        tmp_path):
    write(tmp_path, {"train": DOCUMENTS, "eval": DOCUMENTS[:1]})
    reading = token_shards.open_split(str(tmp_path), "train", BYTES)  # a run maps it
    token_shards.begin(str(tmp_path), ("train", "eval"), BYTES)
    writer = token_shards.SplitWriter(str(tmp_path), "train", BYTES)
    writer.add(np.array([7, 7]), "new")  # ... and the prepare is killed here
    for split in ("train", "eval"):
        with pytest.raises(FileNotFoundError, match=f"no complete '{split}' split"):
            token_shards.open_split(str(tmp_path), split, BYTES)
    np.testing.assert_array_equal(reading.document(2), DOCUMENTS[2])  # its files stay
    write(tmp_path, {"train": DOCUMENTS[::-1], "eval": DOCUMENTS[:1]})
    np.testing.assert_array_equal(
        token_shards.open_split(str(tmp_path), "train", BYTES).document(0), DOCUMENTS[2])


def test_a_truncated_shard_is_refused_naming_the_file(tmp_path):
    write(tmp_path, {"train": DOCUMENTS})
    with open(tmp_path / "train.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(ValueError, match=r"train\.bin has 10 bytes, but meta\.json records 24"):
        token_shards.open_split(str(tmp_path), "train", BYTES)


def test_shards_of_another_tokenizer_are_refused_naming_both(tmp_path):
    write(tmp_path, {"train": DOCUMENTS})
    other = {"kind": "sentencepiece", "vocab_size": 8000, "separator": 2,
             "model_sha256": "ab12"}
    with pytest.raises(ValueError, match="prepared with the tokenizer .*'bytes'.* asks for "
                                         ".*'sentencepiece'"):
        token_shards.open_split(str(tmp_path), "train", other)
    with pytest.raises(ValueError, match="prepared with the tokenizer"):  # would mix them
        token_shards.begin(str(tmp_path), ("eval",), other)
    write(tmp_path, {"train": DOCUMENTS}, other)  # replacing every complete split is fine
    assert token_shards.open_split(str(tmp_path), "train", other).num_documents == 3
