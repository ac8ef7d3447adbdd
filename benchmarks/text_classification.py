"""Text classification on a real labeled set: the shipped config against a TF-IDF +
logistic regression model, against Keras' `fit` on the same model and batches, and what
pretraining a language model on the set's own texts is worth at 200, 1,000 and all labels.

apt-get update -o Acquire::Languages=en   # Debian's package index: the set
python -m benchmarks.text_classification --out=bench/textcls                 # every part
python -m benchmarks.text_classification --parts=data,linear --out=bench/textcls

The set (part `data`): Debian's package descriptions (the index's English ones, short and
long) labeled by
their section (libs, python, games, ...: the sections of at least 100 packages), 10% of
the packages held out by a hash of their name. Real, skewed, and installed offline with
the package index. Parts:
- linear: TF-IDF of words and word pairs + logistic regression (scikit-learn).
- trainer: configs/text.py as shipped, trained --seconds (its step count calibrated).
- fit: the same model, tokenized batches and optimizer under `model.fit`; examples/s,
  time to --target accuracy, final accuracy, against the Trainer.
- pretrain: configs/lm.py (SentencePiece) on the training texts, --seconds.
- sizes: from scratch against from the pretrained LM, with 200, 1,000 and all labels
  (200 and 1,000: both on the LM's vocabulary; all from scratch: part trainer's run).
- float16: a BERT-like keras_hub backbone (random weights, a WordPiece vocabulary of the
  training texts, saved as a preset folder) under mixed_float16: non-finite steps.
Writes results.json and results.md to --out.
"""

import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time

from absl import app, flags

from benchmarks.scratch import fresh_directory
from benchmarks.launched import flags_of, launch, run_parts, steps_per_second

FLAGS = flags.FLAGS
flags.DEFINE_list("parts", ["data", "linear", "trainer", "fit", "pretrain", "sizes",
                            "float16"], "Which parts to run.")
flags.DEFINE_string("out", "bench_textcls", "Output directory.")
flags.DEFINE_float("seconds", 300.0, "Training time of each full-data run.")
flags.DEFINE_float("pretrain_seconds", 600.0, "Training time of the language model.")
flags.DEFINE_float("target", 0.6, "fit: the eval accuracy whose time is compared.")
flags.DEFINE_integer("calibration_steps", 60, "Steps timed to size a run to --seconds.")

MIN_PACKAGES = 100
SIZES = (200, 1000)


def _hash(text):
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") / 2**64


def part_data(out):
    """train.jsonl / eval.jsonl of (text, label), train_<N>.jsonl subsets (every class at
    least once, the rest in proportion), and unlabeled.jsonl (the training texts)."""
    sections = dict(re.findall(r"^Package: (\S+)\n(?:.+\n)*?Section: (\S+)", subprocess.run(
        ["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout, re.M))
    packages = {}
    for path in sorted(glob.glob("/var/lib/apt/lists/*_main_i18n_Translation-en*")):
        index = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", path],
                               capture_output=True, text=True, check=True).stdout
        for name, text in re.findall(r"^Package: (\S+)\n(?:.+\n)*?Description-en: "
                                     r"(.*(?:\n .*)*)", index, re.M):
            if name in sections:
                packages[name] = (re.sub(r"\n \.?", "\n", text),
                                  sections[name].split("/")[-1])
    if not packages:
        raise SystemExit("No package descriptions: run apt-get update -o "
                         "Acquire::Languages=en first (Debian's index and its English "
                         "descriptions).")
    counts = {}
    for _, label in packages.values():
        counts[label] = counts.get(label, 0) + 1
    kept = sorted((n, t, l) for n, (t, l) in packages.items() if counts[l] >= MIN_PACKAGES)
    data = os.path.join(fresh_directory(os.path.join(out, "data")))
    held = [(t, l) for n, t, l in kept if _hash(n) < 0.1]
    train = sorted(((t, l) for n, t, l in kept if _hash(n) >= 0.1), key=lambda r: _hash(r[0]))
    write = lambda name, rows: _write_jsonl(os.path.join(data, name), rows)  # noqa: E731
    write("train.jsonl", train)
    write("eval.jsonl", held)
    write("unlabeled.jsonl", [(t, "") for t, _ in train])
    for size in SIZES:
        write(f"train_{size}.jsonl", _stratified(train, size))
    return {"packages": len(kept), "classes": len({l for _, _, l in kept}),
            "train": len(train), "eval": len(held),
            "largest_class_share": round(max(counts[l] for _, _, l in kept) / len(kept), 3),
            "mean_bytes": round(sum(len(t.encode()) for _, t, _ in kept) / len(kept))}


def _stratified(rows, size):
    """`size` rows in hash order: each class once, then the rest in proportion."""
    by_class = {}
    for row in rows:
        by_class.setdefault(row[1], []).append(row)
    quota = {c: max(1, round(size * len(r) / len(rows))) for c, r in by_class.items()}
    while sum(quota.values()) > size:
        largest = max(quota, key=quota.get)
        quota[largest] -= 1
    return [r for c, r in by_class.items() for r in r[:quota[c]]]


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for text, label in rows:
            f.write(json.dumps({"text": text, "label": label}) + "\n")


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def part_linear(out):
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score
    held = _read_jsonl(os.path.join(out, "data", "eval.jsonl"))
    rows = {}
    for size in (*SIZES, "all"):
        train = _read_jsonl(os.path.join(out, "data", _train_file(size)))
        start = time.monotonic()
        vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2
                                     if len(train) > 1000 else 1)
        model = LogisticRegression(max_iter=2000, C=10.0).fit(
            vectorizer.fit_transform([r["text"] for r in train]), [r["label"] for r in train])
        predicted = model.predict(vectorizer.transform([r["text"] for r in held]))
        labels = [r["label"] for r in held]
        rows[f"{size}_accuracy"] = round(accuracy_score(labels, predicted), 4)
        rows[f"{size}_macro_f1"] = round(f1_score(labels, predicted, average="macro"), 4)
        rows[f"{size}_seconds"] = round(time.monotonic() - start, 1)
    return rows


def _train_file(size):
    return "train.jsonl" if size == "all" else f"train_{size}.jsonl"


def text_flags(out, size="all", **overrides):
    data = os.path.join(out, "data")
    return ["--config=configs/text.py", "--config.data.format=jsonl",
            f"--config.data.train={os.path.join(data, _train_file(size))}",
            f"--config.data.eval={os.path.join(data, 'eval.jsonl')}",
            "--config.trainer.jit_compile=off", *flags_of(overrides)]


def calibrated_steps(args, out, name, seconds=None):
    """The steps that take `seconds` (--seconds), timed over --calibration_steps."""
    every = max(FLAGS.calibration_steps // 5, 1)
    stderr, _, _ = launch(args + flags_of({
        "trainer.train_steps": FLAGS.calibration_steps, "trainer.steps_per_loop": every,
        "trainer.log_every": every, "optimizer.warmup_steps": every,
        "trainer.eval_every": 0}), fresh_directory(os.path.join(out, "runs", name)))
    return int((seconds or FLAGS.seconds) * steps_per_second(stderr))


def budgeted(steps, evals=4):
    return {"trainer.train_steps": steps, "trainer.eval_every": max(steps // evals, 1),
            "trainer.checkpoint_every": max(steps // evals, 1),
            "optimizer.warmup_steps": max(steps // 20, 1), "trainer.steps_per_loop": 50}


def part_trainer(out):
    steps = calibrated_steps(text_flags(out), out, "calibrate_text")
    _, summary, _ = launch(text_flags(out, **budgeted(steps)),
                           fresh_directory(os.path.join(out, "runs", "trainer")))
    return {"steps": steps, "seconds": summary["seconds"]["train"],
            "examples_per_sec": summary["examples_per_sec"],
            "accuracy": round(summary["eval"]["accuracy"], 4),
            "macro_f1": round(summary["eval"]["macro_f1"], 4),
            "eval_curve": _eval_curve(os.path.join(out, "runs", "trainer"),
                                      summary["seconds"]["train"] / steps)}


def _eval_curve(workdir, seconds_per_step):
    """[(seconds of training, eval accuracy)] of a run's evals, from its TensorBoard
    events (the seconds: the eval's step at the run's mean pace)."""
    import tensorflow as tf
    curve = []
    for path in sorted(tf.io.gfile.glob(os.path.join(workdir, "eval", "events.out.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "accuracy":
                    curve.append((round(event.step * seconds_per_step, 1),
                                  round(float(tf.make_ndarray(value.tensor)), 4)))
    return sorted(curve)


def part_fit(out):
    """`model.fit` on the Trainer's own model, batches and schedule, in a process of its
    own (benchmarks/text_fit.py), for as many steps as part `trainer`."""
    steps = json.load(open(os.path.join(out, "results.json")))["trainer"]["steps"]
    data = os.path.join(out, "data")
    run = subprocess.run([sys.executable, "-m", "benchmarks.text_fit", f"--steps={steps}",
                          f"--train={os.path.join(data, 'train.jsonl')}",
                          f"--eval={os.path.join(data, 'eval.jsonl')}",
                          f"--target={FLAGS.target}"], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(run.stderr[-3000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def part_pretrain(out):
    args = ["--config=configs/lm.py", "--config.data.format=jsonl",
            f"--config.data.train={os.path.join(out, 'data', 'unlabeled.jsonl')}",
            "--config.tokenizer.kind=sentencepiece", "--config.sample.summary_tokens=0",
            f"--config.data.prepared={os.path.join(out, 'shards')}",
            "--config.trainer.jit_compile=off"]
    steps = calibrated_steps(args, out, "calibrate_lm", FLAGS.pretrain_seconds)
    _, summary, _ = launch(args + flags_of(budgeted(steps, evals=2)),
                           fresh_directory(os.path.join(out, "runs", "lm")))
    return {"steps": steps, "seconds": summary["seconds"]["train"],
            "bits_per_byte": round(summary["eval"]["bits_per_byte"], 4)}


def part_sizes(out):
    """Each size from scratch and from the LM, for as many steps as the full run (its
    schedule) or 20 epochs of a small set, whichever is fewer. Both use the LM's
    vocabulary (a few hundred texts cannot train one of 8,000 pieces), so only the
    weights they start from differ; `all` from scratch is part `trainer`'s run."""
    results = json.load(open(os.path.join(out, "results.json")))
    full_steps, rows = results["trainer"]["steps"], {}
    lm = os.path.join(out, "runs", "lm")
    vocabulary = os.path.join(out, "shards", "tokenizer.model")
    for size in (*SIZES, "all"):
        examples = len(_read_jsonl(os.path.join(out, "data", _train_file(size))))
        steps = min(full_steps, max(20 * examples // 32, 100))
        for start, extra in (("scratch", {"tokenizer.model": vocabulary}),
                             ("pretrained", {"init.checkpoint": lm})):
            if size == "all" and start == "scratch":
                rows["all_scratch_accuracy"] = results["trainer"]["accuracy"]
                rows["all_scratch_macro_f1"] = results["trainer"]["macro_f1"]
                continue
            _, summary, _ = launch(text_flags(out, size, **budgeted(steps, evals=1), **extra),
                                   fresh_directory(os.path.join(out, "runs", f"{size}_{start}")))
            rows[f"{size}_{start}_steps"] = steps
            rows[f"{size}_{start}_accuracy"] = round(summary["eval"]["accuracy"], 4)
            rows[f"{size}_{start}_macro_f1"] = round(summary["eval"]["macro_f1"], 4)
    return rows


def part_float16(out, steps=60):
    """A keras_hub BERT-like backbone on the real set under mixed_float16 (and float32,
    the reference): skipped steps, the loss scale's lines, accuracy. Small, and few
    steps: a CPU emulates float16."""
    workdir = fresh_directory(os.path.join(out, "runs", "float16"))
    preset = os.path.join(workdir, "preset")
    subprocess.run([sys.executable, "-m", "benchmarks.text_fit", "--make_bert_preset",
                    f"--workdir={preset}", f"--train={os.path.join(out, 'data', 'train.jsonl')}"],
                   check=True, capture_output=True)
    rows = {"steps": steps}
    for precision in ("float32", "mixed_float16"):
        stderr, summary, _ = launch(text_flags(out, **{
            "model.backbone": preset, "model.pool": "first", "model.seq_len": 64,
            "data.global_batch_size": 16, "precision": precision,
            "optimizer.learning_rate": 1e-3, **budgeted(steps, evals=1)}),
            os.path.join(workdir, precision))
        rows[f"{precision}_skipped_steps"] = summary.get("skipped_steps")
        rows[f"{precision}_stopped"] = summary["stopped"]
        rows[f"{precision}_eval_loss"] = round(summary["eval"]["loss"], 4)
        rows[f"{precision}_train_seconds"] = summary["seconds"]["train"]
        rows[f"{precision}_nonfinite_lines"] = [line[-200:] for line in stderr.splitlines()
                                                if "non-finite" in line][:3]
    return rows


PARTS = {"data": part_data, "linear": part_linear, "trainer": part_trainer, "fit": part_fit,
         "pretrain": part_pretrain, "sizes": part_sizes, "float16": part_float16}


def main(argv):
    del argv
    run_parts(FLAGS.parts, PARTS, FLAGS.out)


if __name__ == "__main__":
    app.run(main)
