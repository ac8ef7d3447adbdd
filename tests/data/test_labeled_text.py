"""Labeled texts: each format read alike, labels by sorted name or as integers, and each
bad input named in one line (empty texts, bytes that are not UTF-8, an eval label train
lacks, a missing field, a preset folder without weights or with weights of another
model)."""

import json
import os
import shutil

import ml_collections
import pytest

from support.text_data import (texts, tiny_bert_preset, tiny_gpt2_preset, write_csv,
                               write_folder, write_jsonl)
from tasks.models import presets
from trainer.data import labeled_text
from trainer.data.prepare_text import BadDocument


def data(**fields):
    return ml_collections.ConfigDict(dict(dict(
        format="jsonl", train="", eval="", text_key="text", label_key="label",
        eval_fraction=0.1, skip_bad=False, tfds_name="", tfds_data_dir=""), **fields))


def test_folder_jsonl_and_csv_read_the_same_texts_and_labels(tmp_path):
    examples = texts(60)
    read = [labeled_text.read(d) for d in (
        data(format="folder", train=write_folder(tmp_path / "f", examples[:45]),
             eval=write_folder(tmp_path / "g", examples[45:])),
        data(format="jsonl", train=write_jsonl(tmp_path / "t.jsonl", examples[:45]),
             eval=write_jsonl(tmp_path / "e.jsonl", examples[45:])),
        data(format="csv", train=write_csv(tmp_path / "t.csv", examples[:45]),
             eval=write_csv(tmp_path / "e.csv", examples[45:])))]
    for r in read:
        assert r.label_names == ["cooking", "sports", "weather"]
        pairs = sorted(zip(r.train.texts, r.train.labels))
        assert pairs == sorted((t.encode(), r.label_names.index(label))
                               for t, label in examples[:45])
        assert len(r.eval.texts) == 15


def test_integer_labels_are_their_own_ids_and_eval_held_out_by_hash(tmp_path):
    examples = [(t, ["cooking", "sports", "weather"].index(label)) for t, label in texts(90)]
    r = labeled_text.read(data(train=write_jsonl(tmp_path / "t.jsonl", examples),
                               eval_fraction=0.2))
    assert r.label_names == ["0", "1", "2"]
    assert 0 < len(r.eval.texts) < 40 and len(r.train.texts) + len(r.eval.texts) == 90
    assert not set(r.eval.texts) & set(r.train.texts)
    csv = labeled_text.read(data(format="csv", train=write_csv(tmp_path / "t.csv", examples),
                                 eval_fraction=0.2))
    assert csv.label_names == ["0", "1", "2"] and csv.train.labels == r.train.labels


def test_an_eval_label_train_lacks_is_named(tmp_path):
    train = write_jsonl(tmp_path / "t.jsonl", texts(30))
    held = write_jsonl(tmp_path / "e.jsonl", texts(3) + [("a new kind of text", "music")])
    with pytest.raises(ValueError, match=r"e\.jsonl:4: the eval label 'music' is not among"):
        labeled_text.read(data(train=train, eval=held))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_missing_field_names_the_file_and_line(tmp_path, fmt):
    path = tmp_path / f"t.{fmt}"
    if fmt == "jsonl":
        write_jsonl(path, texts(5))
        with open(path, "a") as f:
            f.write(json.dumps({"text": "no label here"}) + "\n")
        line = 6
    else:
        write_csv(path, texts(5))
        with open(path, "a") as f:
            f.write('"no label here"\n')
        line = 7  # the header is line 1
    with pytest.raises(BadDocument, match=rf"t\.{fmt}:{line} has no field 'label' "
                                          r"\(data.label_key\)"):
        labeled_text.read(data(format=fmt, train=str(path)))
    with pytest.raises(BadDocument, match=r"has no field 'body' \(data.text_key\); its "
                                          "fields: text, label"):
        labeled_text.read(data(format=fmt, train=str(path), text_key="body"))


def test_empty_texts_are_named_or_left_out_and_bad_utf8_is_kept(tmp_path):
    examples = texts(30)
    root = write_folder(tmp_path / "f", examples)
    open(os.path.join(root, "sports", "empty.txt"), "w").close()
    with open(os.path.join(root, "weather", "latin1.txt"), "wb") as f:
        f.write(b"caf\xe9 rain")  # Latin-1, not UTF-8
    with pytest.raises(BadDocument, match=r"empty\.txt has an empty text .* "
                                          r"--config\.data\.skip_bad=True"):
        labeled_text.read(data(format="folder", train=root))
    r = labeled_text.read(data(format="folder", train=root, skip_bad=True, eval_fraction=0.3))
    everything = r.train.texts + r.eval.texts
    assert len(everything) == 31 and b"caf\xe9 rain" in everything
    assert r.train.invalid_utf8 + r.eval.invalid_utf8 == 1


def test_a_tfds_text_dataset_prepared_offline(tmp_path):
    import tensorflow_datasets as tfds
    examples = texts(40)
    names = ["cooking", "sports", "weather"]

    class TinyTexts(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("1.0.0")
        code_path = None  # no checksums to look for (as tests/support/image_data.py)

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "text": tfds.features.Text(), "label": tfds.features.ClassLabel(names=names)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(examples[:30]),
                    "test": self._generate_examples(examples[30:])}

        def _generate_examples(self, part):
            for i, (text, label) in enumerate(part):
                yield i, {"text": text, "label": label}

    TinyTexts.name = "tiny_texts"
    TinyTexts(data_dir=str(tmp_path)).download_and_prepare(
        download_config=tfds.download.DownloadConfig(verify_ssl=False))
    r = labeled_text.read(data(format="tfds", tfds_name="tiny_texts", train="train",
                               eval="test", tfds_data_dir=str(tmp_path)))
    assert r.label_names == names and len(r.train.texts) == 30 and len(r.eval.texts) == 10
    assert sorted(zip(r.eval.texts, r.eval.labels)) == sorted(
        (t.encode(), names.index(label)) for t, label in examples[30:])


def test_a_preset_name_is_refused_with_how_to_make_a_folder():
    with pytest.raises(ValueError, match=r"bert_tiny_en_uncased.*would be downloaded.*"
                                         r"save_to_preset"):
        presets.check_folder("bert_tiny_en_uncased")


def test_a_preset_without_weights_or_with_another_models_names_the_file(tmp_path):
    bert = tiny_bert_preset(tmp_path / "bert")
    os.remove(os.path.join(bert, "model.weights.h5"))
    with pytest.raises(FileNotFoundError, match=r"bert/model\.weights\.h5 is missing"):
        presets.load_backbone(bert)
    gpt2 = tiny_gpt2_preset(tmp_path / "gpt2")
    shutil.copy(os.path.join(gpt2, "model.weights.h5"), bert)  # another model's weights
    with pytest.raises(ValueError, match=r"bert/model\.weights\.h5 does not fit "
                                         r".*bert/config\.json"):
        presets.load_backbone(bert)


def test_csv_number_labels_a_bom_and_sparse_or_broken_labels(tmp_path):
    path = tmp_path / "t.csv"
    rows = "\n".join(f'"text {i}",0{i % 3}' for i in range(30))
    path.write_bytes(b"\xef\xbb\xbftext,label\n" + rows.encode() + b"\n")  # Excel's BOM
    r = labeled_text.read(data(format="csv", train=str(path), eval_fraction=0.3))
    assert r.label_names == ["0", "1", "2"]  # "01" is class 1
    sparse = [(t, 1000 * ["cooking", "sports", "weather"].index(label))
              for t, label in texts(30)]
    with pytest.raises(ValueError, match=r"run from 0 to 2000 with 3 distinct values"):
        labeled_text.read(data(train=write_jsonl(tmp_path / "s.jsonl", sparse)))
    broken = tmp_path / "b.jsonl"
    write_jsonl(broken, texts(5))
    with open(broken, "a") as f:
        f.write('{"text": "half an emoji \\ud83d", "label": "sports"}\n')
    with pytest.raises(BadDocument, match=r"b\.jsonl:6: the text is not valid Unicode"):
        labeled_text.read(data(train=str(broken)))
