"""The benchmark harness runs end to end on a tiny setting (no timing is asserted)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.e2e
def test_compare_harness_smoke(tmp_path):
    out = tmp_path / "bench"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", "--task=lm", "--tiny", "--steps=2",
         "--repeats=2", "--steps_per_loop=1,2", "--fit_steps_per_execution=1,2",
         "--precisions=float32", f"--out={out}"],
        cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
        text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.load(open(out / "results.json"))
    assert set(results["precisions"]) == {"float32"}
    names = [r["contender"] for r in results["precisions"]["float32"]]
    assert names == ["Trainer spl=2", "fit spe=1", "fit spe=2", "bare loop"]
    assert [r["contender"] for r in results["features"]] == [
        "plain", "accumulation_steps=4", "per-step summaries", "EMA 0.999"]
    for rows in list(results["precisions"].values()) + [results["steps_per_loop"],
                                                       results["input_pipeline"],
                                                       results["features"]]:
        for r in rows:
            assert 0 < r["min"] <= r["examples_per_sec"] <= r["max"]
            assert r["tokens_per_sec"] == r["examples_per_sec"] * 32
    assert [r["contender"] for r in results["steps_per_loop"]] == ["Trainer spl=1",
                                                                  "Trainer spl=2"]
    assert "| bare loop |" in run.stdout and "tokens/s" in run.stdout
    assert "| accumulation_steps=4 |" in run.stdout
    assert (out / "results.png").stat().st_size > 1000


@pytest.mark.e2e
def test_fit_parity_harness_smoke(tmp_path):
    """The Trainer-vs-model.fit learning comparison runs end to end (accuracy numbers are
    the benchmark's, not asserted here: 4 steps learn nothing reliable)."""
    out = tmp_path / "parity"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.fit_parity", "--train_size=1024",
         "--test_size=256", "--epochs=2", "--seeds=0", f"--out={out}"],
        cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
        text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.load(open(out / "results.json"))
    (row,) = results["rows"]
    assert 0 <= row["trainer"] <= 1 and 0 <= row["fit"] <= 1
    assert row["difference"] == row["trainer"] - row["fit"]
    assert "eval @ step 4:" in run.stderr and "num_examples=256" in run.stderr
    assert "| 0 |" in (out / "results.md").read_text()


@pytest.mark.e2e
def test_time_to_accuracy_harness_smoke(tmp_path):
    """The Trainer and model.fit both train a tiny LM to an easy bits-per-byte target;
    the report gives each one's time and the steps it took (no timing is asserted)."""
    out = tmp_path / "tta"
    tiny = ("model.num_layers=1,model.d_model=32,model.num_heads=2,model.mlp_dim=64,"
            "model.seq_len=32,data.max_bytes=100000,trainer.train_steps=40,"
            "optimizer.warmup_steps=0,trainer.jit_compile=off")
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.time_to_accuracy", "--workloads=lm",
         "--repeats=1", "--target=7.0", "--eval_every=10", f"--set={tiny}", f"--out={out}"],
        cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
        text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.load(open(out / "results.json"))
    for contender in ("trainer", "fit"):
        (r,) = results["runs"]["lm"][contender]
        assert r["value"] <= 7.0 and r["seconds"] > 0 and r["step"] % 10 == 0
        first_hit = next(s for _, s, v in r["curve"] if v <= 7.0)
        assert r["step"] == first_hit
    assert "| lm | bits_per_byte <= 7.0 |" in run.stdout


@pytest.mark.e2e
def test_checkpoint_stall_harness_smoke(tmp_path):
    """Each mode trains and saves; the report has a stall and a save() time for blocking
    and asynchronous saves (no timing is asserted), and the harness's three workdirs
    are gone at the end."""
    out, scratch = tmp_path / "stall", tmp_path / "tmp"
    scratch.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.checkpoint_stall", "--config=lm", "--tiny",
         "--steps=2", "--chunks=2", "--repeats=1", f"--out={out}"],
        cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(scratch)),
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.load(open(out / "results.json"))
    assert results["config"] == "lm" and results["checkpoints_bytes"] > 0
    for mode in ("async_off", "async_on"):
        assert results[mode]["save_call_seconds"] > 0
        low, high = results[mode]["stall_min_max"]
        assert low <= results[mode]["stall_seconds_per_checkpoint"] <= high
    assert not list(scratch.iterdir())


def test_a_benchmark_deletes_only_directories_it_made(tmp_path):
    from benchmarks import image_files, scratch
    mine = tmp_path / "mine"  # --data=DIR naming a folder the user already had
    mine.mkdir()
    (mine / "keep.txt").write_text("the user's")
    with pytest.raises(SystemExit, match=r"holds files a benchmark did not write; nothing "
                                         r"was deleted"):
        image_files.write_data(str(mine), 10)
    assert (mine / "keep.txt").read_text() == "the user's"
    made = scratch.fresh_directory(str(tmp_path / "made"))  # a benchmark's own, rewritten
    (tmp_path / "made" / "old_run").write_text("")
    assert scratch.fresh_directory(made) == made
    assert os.listdir(made) == [scratch.MARK]


@pytest.mark.e2e
def test_text_harness_smoke(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = open(textwrap.__file__).read().splitlines(keepends=True)  # real text, offline
    for i in range(30):
        (corpus / f"{i}.txt").write_text("".join(lines[i::30]))
    out = tmp_path / "bench"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.text", "--parts=prepare,input,sampling",
         f"--corpus={corpus}/*.txt", "--vocab_size=500", "--input_batches=5",
         f"--out={out}"],
        cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
        text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.load(open(out / "results.json"))
    assert results["prepare"]["documents"] == 30
    assert {"mapped_over_memory", "memory_windows_s"} <= set(results["input"])
    assert results["sampling"]["cached_tokens_s"] > 0
    assert "| mapped_over_memory |" in open(out / "results.md").read()
