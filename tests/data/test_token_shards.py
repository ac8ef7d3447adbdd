"""Token shards: what a prepare writes is read back exactly by memory map, and a split
that is incomplete, truncated or made by another tokenizer never reads as usable."""

import os

import numpy as np
import pytest

from trainer.data import token_shards

BYTES = {"kind": "bytes", "vocab_size": 256}
DOCUMENTS = [np.array([1, 2, 3]), np.array([], np.int64), np.arange(250, 256)]


def test_documents_are_read_back_exactly_by_memory_map(tmp_path):
    record = token_shards.write_split(str(tmp_path), "train", iter(DOCUMENTS), BYTES)
    assert record["documents"] == 3 and record["tokens"] == 9
    split = token_shards.open_split(str(tmp_path), "train", BYTES)
    assert isinstance(split.tokens, np.memmap) and split.tokens.dtype == np.uint16
    assert split.num_documents == 3
    for i, document in enumerate(DOCUMENTS):
        np.testing.assert_array_equal(split.document(i), document)
    assert os.path.getsize(tmp_path / "train.bin") == 9 * 2


@pytest.mark.parametrize("vocab_size, dtype", [(65_536, np.uint16), (65_537, np.uint32)])
def test_ids_are_uint16_while_the_vocabulary_fits(tmp_path, vocab_size, dtype):
    tokenizer = {"kind": "sentencepiece", "vocab_size": vocab_size}
    top = np.array([0, vocab_size - 1])
    token_shards.write_split(str(tmp_path), "train", [top], tokenizer)
    split = token_shards.open_split(str(tmp_path), "train", tokenizer)
    assert split.tokens.dtype == dtype
    np.testing.assert_array_equal(split.document(0), top)


def test_an_id_outside_the_vocabulary_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"document 1 is outside \[0, 256\)"):
        token_shards.write_split(str(tmp_path), "train", [np.array([1]), np.array([256])],
                                 BYTES)


def test_an_interrupted_write_never_reads_as_complete_and_a_new_write_completes(tmp_path):
    token_shards.write_split(str(tmp_path), "train", DOCUMENTS, BYTES)

    def interrupted():
        yield np.array([7, 7])
        raise KeyboardInterrupt  # a kill in the middle of the split

    with pytest.raises(KeyboardInterrupt):
        token_shards.write_split(str(tmp_path), "train", interrupted(), BYTES)
    with pytest.raises(FileNotFoundError, match="no complete 'train' split"):
        token_shards.open_split(str(tmp_path), "train", BYTES)
    token_shards.write_split(str(tmp_path), "train", DOCUMENTS, BYTES)
    assert token_shards.open_split(str(tmp_path), "train", BYTES).num_documents == 3


def test_a_truncated_shard_is_refused_naming_the_file(tmp_path):
    token_shards.write_split(str(tmp_path), "train", DOCUMENTS, BYTES)
    with open(tmp_path / "train.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(ValueError, match=r"train\.bin has 10 bytes, but meta\.json records 18"):
        token_shards.open_split(str(tmp_path), "train", BYTES)


def test_shards_of_another_tokenizer_are_refused_naming_both(tmp_path):
    token_shards.write_split(str(tmp_path), "train", DOCUMENTS, BYTES)
    other = {"kind": "sentencepiece", "vocab_size": 8000, "model_sha256": "ab12"}
    with pytest.raises(ValueError, match="prepared with the tokenizer .*'bytes'.* asks for "
                                         ".*'sentencepiece'"):
        token_shards.open_split(str(tmp_path), "train", other)
    with pytest.raises(ValueError, match="prepared with the tokenizer"):
        token_shards.write_split(str(tmp_path), "eval", DOCUMENTS, other)
