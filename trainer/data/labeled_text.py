"""Labeled texts for classification: read whole into memory, each example by index.

`data.format`:
- folder: one subfolder of `.txt` files per class (the layout Keras'
  `text_dataset_from_directory` reads); a file is one text.
- jsonl / csv: a glob of files; `data.text_key` and `data.label_key` name each
  record's fields (a CSV's header row names its columns).
- tfds: `data.tfds_name`, a TFDS dataset prepared offline, and its splits
  `data.train` and `data.eval`.

Labels are strings or integers. Strings map to ids in sorted order; integers (a CSV
column of digits too) are their own ids. The names are saved with the run and its
export. A text file's or CSV's bytes stay as read: a byte that is not valid UTF-8 is
kept for the tokenizer and counted (JSON holds only valid text). Without `data.eval`,
`data.eval_fraction` of the training texts, chosen by a hash of each text, are held
out.
"""

import csv
import dataclasses
import glob
import io
import json
import os
import re
import sysconfig

from absl import logging

from trainer.data.prepare_text import BadDocument, held_out, read_file, valid_utf8

FORMATS = ("folder", "jsonl", "csv", "tfds")
_DEFINITION = re.compile(rb"^(?=(?:async def|def|class) )", re.M)  # a top-level one starts


@dataclasses.dataclass
class Split:
    texts: list      # UTF-8 bytes, one per example
    labels: list     # ids into LabeledText.label_names
    skipped: int = 0
    invalid_utf8: int = 0


@dataclasses.dataclass
class LabeledText:
    train: Split
    eval: Split
    label_names: list

    def describe(self, source):
        return (f"{source}: {len(self.train.texts)} training and {len(self.eval.texts)} "
                f"eval texts in {len(self.label_names)} classes")


def read(data):
    """The train and eval splits of `data` (a config's data section) with their labels."""
    if data.format not in FORMATS:
        raise ValueError(f"data.format={data.format!r} is unknown for text classification; "
                         f"choose one of {', '.join(FORMATS)}.")
    if not data.train:
        raise ValueError("data.train is empty: name the training texts (a folder, a glob "
                         "of .jsonl or .csv files, or a TFDS dataset).")
    if data.format == "tfds":
        from trainer.data.text_tfds import read_tfds  # tensorflow-datasets: the data extra
        train, held, label_names = read_tfds(data)
        return _labeled(_checked(train, data), _checked(held, data), label_names, data)
    train = _checked(_records(data.train, data), data)
    if data.eval:
        held = _checked(_records(data.eval, data), data)
    else:
        keep = [not held_out(text, data.eval_fraction) for text, _, _ in train]
        if all(keep):
            raise ValueError(f"data.eval_fraction={data.eval_fraction} holds out none of the "
                             f"{len(train)} training texts: raise it, or name held-out texts "
                             "with --config.data.eval.")
        if not any(keep):
            raise ValueError(f"data.eval_fraction={data.eval_fraction} holds out all of the "
                             f"{len(train)} training texts: lower it.")
        held = [r for r, k in zip(train, keep) if not k]
        train = [r for r, k in zip(train, keep) if k]
    return _labeled(train, held, None, data)


def _records(pattern, data):
    """[(text bytes, label, where)] of a folder or of the files a glob matches."""
    path = os.path.expanduser(pattern)
    if pattern == "stdlib":
        return _stdlib_records()
    if data.format == "folder":
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{pattern} is not a folder: data.format=folder reads "
                                    "one subfolder of .txt files per class.")
        classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
        records = [(read_file(f), name, f) for name in classes
                   for f in sorted(glob.glob(os.path.join(path, name, "*.txt")))]
        if not records:
            raise FileNotFoundError(f"{pattern} holds no class subfolder of .txt files.")
        return records
    files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
    if not files:
        raise FileNotFoundError(f"{pattern} matches no files: point data.train/data.eval "
                                f"at a glob of .{data.format} files.")
    read_records = _jsonl_records if data.format == "jsonl" else _csv_records
    return [r for f in files for r in read_records(f, data.text_key, data.label_key)]


def _stdlib_records(min_files=10):
    """The running Python's standard library as labeled text, present offline: each
    top-level definition of a package's modules, labeled by the package (asyncio,
    email, xml, ...: those of at least `min_files` modules)."""
    root = sysconfig.get_paths()["stdlib"]
    records = []
    for package in sorted(os.listdir(root)):
        files = sorted(glob.glob(os.path.join(root, package, "**", "*.py"), recursive=True))
        if package in ("test", "idlelib", "site-packages") or len(files) < min_files:
            continue
        for path in files:
            source = read_file(path)
            for number, chunk in enumerate(_DEFINITION.split(source)):
                if chunk.count(b"\n") >= 3 and _DEFINITION.match(chunk):
                    records.append((chunk, package, f"{path} definition {number}"))
    return records


def _jsonl_records(path, text_key, label_key):
    records = []
    for number, line in enumerate(read_file(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except (UnicodeError, json.JSONDecodeError) as e:
            raise BadDocument(f"{where} is not a JSON object of UTF-8 text ({e}).") from e
        if not isinstance(record, dict):
            raise BadDocument(f"{where} is not a JSON object.")
        records.append(_fields(record, text_key, label_key, where))
    return records


def _csv_records(path, text_key, label_key):
    # Decoded with surrogateescape, so a byte that is not UTF-8 survives to the tokenizer.
    content = read_file(path).decode("utf-8-sig", errors="surrogateescape")  # (a BOM)
    reader = csv.DictReader(io.StringIO(content, newline=""))
    return [_fields(row, text_key, label_key, f"{path}:{reader.line_num}")
            for row in reader]


def _fields(record, text_key, label_key, where):
    for key, field in ((text_key, "data.text_key"), (label_key, "data.label_key")):
        if record.get(key) is None:
            raise BadDocument(f"{where} has no field {key!r} ({field}); its fields: "
                              f"{', '.join(map(str, record)) or 'none'}. Set --config.{field}.")
    text, label = record[text_key], record[label_key]
    if not isinstance(text, str):
        raise BadDocument(f"{where}: the text field {text_key!r} is not a string.")
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise BadDocument(f"{where}: the label {label!r} is neither a string nor an integer.")
    try:
        encoded = text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError as e:  # a lone surrogate (half an emoji, cut)
        raise BadDocument(f"{where}: the text is not valid Unicode ({e.reason} at "
                          f"character {e.start}); fix or remove it.") from e
    return encoded, label, where


def _checked(records, data):
    """The records without empty texts (an error naming the first, unless skip_bad)."""
    kept = [r for r in records if r[0].strip()]
    if len(kept) < len(records):
        first = next(r[2] for r in records if not r[0].strip())
        if not data.skip_bad:
            raise BadDocument(f"{first} has an empty text ({len(records) - len(kept)} "
                              "empty in all). Fix or remove them, or set "
                              "--config.data.skip_bad=True to leave them out (counted in "
                              "the log).")
        logging.warning("Left out %d empty texts (data.skip_bad), the first %s.",
                        len(records) - len(kept), first)
    return kept


def _labeled(train, held, label_names, data):
    """Splits of label ids: names sorted, or integers as their own ids (label_names
    given: a TFDS ClassLabel's)."""
    if not train:
        raise ValueError(f"{data.train} holds no training texts.")
    if label_names is None:
        train, held = _numbers_as_ints(train, data), _numbers_as_ints(held, data)
        label_names = _label_names(train)
    ids = {name: i for i, name in enumerate(label_names)}
    seen = {str(label) for _, label, _ in train}
    for text, label, where in held:
        if str(label) not in seen:
            raise ValueError(
                f"{where}: the eval label {label!r} is not among the training labels "
                f"({', '.join(sorted(seen)[:20])}): " + (
                    "add training texts of it, or leave it out of the eval set." if data.eval
                    else "data.eval_fraction held out every text of it; give it more texts, "
                    "or name held-out texts with --config.data.eval."))

    def split(records):
        invalid = sum(1 for text, _, _ in records if not valid_utf8(text))
        return Split([r[0] for r in records], [ids[str(r[1])] for r in records],
                     invalid_utf8=invalid)

    labeled = LabeledText(split(train), split(held), label_names)
    invalid = labeled.train.invalid_utf8 + labeled.eval.invalid_utf8
    if invalid:
        logging.warning("%d texts hold bytes that are not UTF-8: kept as they are for the "
                        "tokenizer.", invalid)
    return labeled


def _numbers_as_ints(records, data):
    """A CSV's labels as integers when every one is a number ("07" is 7)."""
    if data.format != "csv" or not all(str(r[1]).isdecimal() for r in records):
        return records
    return [(text, int(label), where) for text, label, where in records]


def _label_names(train):
    """Sorted names, or "0".."max" for integer labels."""
    labels = [label for _, label, _ in train]
    kinds = {type(label) for label in labels}
    if len(kinds) > 1:
        where = next(w for _, label, w in train if isinstance(label, int))
        raise ValueError(f"{where}: its label is an integer, others are strings; make the "
                         "labels all one kind.")
    if kinds != {int}:
        return sorted(set(labels))
    low, high, distinct = min(labels), max(labels), len(set(labels))
    if low < 0 or high + 1 > 2 * distinct:
        raise ValueError(
            f"{_source(train)}: integer labels are class ids 0..N-1, but these run from "
            f"{low} to {high} with {distinct} distinct values (a head of {high + 1} "
            "classes): number the classes from 0, or write the labels as strings to "
            "name them.")
    return [str(i) for i in range(high + 1)]


def _source(records):
    """Where the records come from (the first one's file)."""
    return records[0][2].rsplit(":", 1)[0]
