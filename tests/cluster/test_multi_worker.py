"""MultiWorkerMirroredStrategy for real: two worker processes on localhost ports."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks.faults import free_ports
from support import ROOT

pytestmark = pytest.mark.e2e  # every test starts worker processes

WORKER = os.path.join(ROOT, "tests", "support", "multi_worker_main.py")  # one worker's script


def start_workers(workdir, out_dir, steps=None, *extra, script=WORKER, out="npz"):
    cluster = {"worker": [f"localhost:{p}" for p in free_ports(2)]}
    procs = []
    for i in range(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                   TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                      "index": i}}))
        log = open(os.path.join(out_dir, f"worker{i}.log"), "w")
        procs.append(subprocess.Popen(
            [sys.executable, script, str(workdir),
             os.path.join(out_dir, f"worker{i}.{out}"),
             *[str(a) for a in (steps, *extra) if a is not None]],
            env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def finish(procs, timeout):
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def checkpoints(workdir):
    return sorted(int(f.split("-")[1].split(".")[0])
                  for f in os.listdir(os.path.join(workdir, "checkpoints"))
                  if f.endswith(".index"))


def assert_same_weights(out_dir, step):
    a, b = (np.load(os.path.join(out_dir, f"worker{i}.npz")) for i in range(2))
    assert int(a["step"]) == int(b["step"]) == step
    assert len(a.files) > 2
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_two_workers_learn_what_one_process_with_two_replicas_does(tmp_path):
    """2 processes x 1 replica against 1 process x 2 replicas (same global batch, seed and
    data): the same weights and per-step losses to reduction-order noise, far closer than
    a run with another seed; then the one process resumes the workers' step-10 checkpoint
    and ends where the workers did. Only the chief writes the workdir."""
    workdir = tmp_path / "wd"
    procs = start_workers(workdir, tmp_path, steps=20)
    codes = finish(procs, timeout=240)
    logs = [open(tmp_path / f"worker{i}.log").read() for i in range(2)]
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "CollectiveAllReduceStrategy with 2 replica(s)" in logs[0]
    assert_same_weights(tmp_path, 20)
    assert checkpoints(workdir) == [10, 20]
    written = sorted(n for n in os.listdir(workdir) if not n.startswith("events.out"))
    assert written == ["best", "checkpoints", "config.json", "eval", "goodput.jsonl",
                       "summary.json", "train"]
    assert json.load(open(workdir / "summary.json"))["replicas"] == 2
    for i in range(2):  # the config's action ran on every worker at its steps
        assert open(tmp_path / f"worker{i}.npz.steps").read().split() == ["5", "10", "15", "20"]

    from support import build, scalars, two_replicas
    from support.multi_worker_main import worker_config
    workers = np.load(tmp_path / "worker0.npz")
    workers = [workers[f"w{i}"] for i in range(len(workers.files) - 1)]
    workers_loss = np.array([v for _, v in scalars(workdir, "train")["loss"]])
    assert len(workers_loss) == 20

    def one_process(name, seed=0, resume_from=None):
        config = worker_config(20)
        config.seed, config.distribution.strategy = seed, "mirrored"
        trainer = build(config, tmp_path / name, two_replicas())
        if resume_from:
            trainer.restore(str(resume_from))
        trainer.train()
        return ([w.numpy() for w in trainer.model.weights],
                np.array([v for _, v in scalars(tmp_path / name, "train")["loss"]]))

    def distance(weights):
        return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, workers))

    weights, loss = one_process("one")
    other_weights, other_loss = one_process("other_seed", seed=1)
    resumed, _ = one_process("resumed", resume_from=workdir / "checkpoints" / "ckpt-10")
    noise = distance(other_weights)
    assert distance(weights) < noise / 100, (distance(weights), noise)
    assert distance(resumed) < noise / 100, (distance(resumed), noise)
    assert np.max(np.abs(loss - workers_loss)) < np.max(np.abs(other_loss - workers_loss)) / 100


def test_a_stop_asked_on_the_chief_alone_stops_every_worker_at_that_step(tmp_path):
    """With gradient accumulation (2 micro-batches of 8 per worker) and an EMA: the
    workers also train exactly like one process on the same 32 examples a step."""
    workdir = tmp_path / "wd"
    codes = finish(start_workers(workdir, tmp_path, 40, "15", "2"), timeout=240)
    logs = [open(tmp_path / f"worker{i}.log").read() for i in range(2)]
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert_same_weights(tmp_path, 15)
    assert checkpoints(workdir) == [10, 15]  # the final checkpoint at the stop
    for log in logs:
        assert "Stopping at step 15: " in log

    from support import build
    from support.multi_worker_main import worker_config
    config = worker_config(15)
    config.optimizer.ema_decay = 0.9
    one = build(config, tmp_path / "one_process")
    one.train()
    workers = np.load(tmp_path / "worker0.npz")
    for i, w in enumerate(one.model.weights):
        np.testing.assert_allclose(workers[f"w{i}"], w.numpy(), rtol=1e-4, atol=1e-5)
    for i, a in enumerate(one.ema.averages):
        np.testing.assert_allclose(workers[f"ema{i}"], a.numpy(), rtol=1e-4, atol=1e-5)


def test_dead_worker_stops_the_other_and_relaunch_resumes(tmp_path):
    workdir = tmp_path / "wd"
    procs = start_workers(workdir, tmp_path, steps=100000)
    deadline = time.time() + 180
    while time.time() < deadline and not (os.path.isdir(workdir / "checkpoints")
                                          and checkpoints(workdir)):
        time.sleep(0.5)
    assert checkpoints(workdir), "no checkpoint within 180 s"
    procs[1].send_signal(signal.SIGKILL)
    killed = time.time()
    code = finish(procs[:1], timeout=120)[0]
    waited = time.time() - killed
    log = open(tmp_path / "worker0.log").read()
    assert code != 0 and waited < 120
    assert "A peer worker failed or became unreachable" in log, log[-3000:]
    assert "Relaunch every worker" in log

    resume_from = checkpoints(workdir)[-1]
    procs = start_workers(workdir, tmp_path, steps=resume_from + 10)
    codes = finish(procs, timeout=240)
    assert codes == [0, 0], open(tmp_path / "worker0.log").read()[-3000:]
    assert checkpoints(workdir)[-1] == resume_from + 10
    log = open(tmp_path / "worker0.log").read()
    assert f"Restored {workdir}/checkpoints/ckpt-{resume_from} (step {resume_from})" in log
    assert f"step {resume_from + 5}/{resume_from + 10}" in log
    assert_same_weights(tmp_path, resume_from + 10)


def test_sigterm_to_a_non_chief_worker_stops_every_worker_the_same_way(tmp_path):
    """Both workers save at the same step and exit 128+SIGTERM, without a traceback."""
    cluster = {"worker": [f"localhost:{p}" for p in free_ports(2)]}
    args = [sys.executable, os.path.join(ROOT, "launch.py"),
            "--config=configs/cifar.py", f"--workdir={tmp_path / 'wd'}", "--mode=train",
            "--config.distribution.strategy=multi_worker",
            "--config.distribution.collective_timeout_seconds=30",
            "--config.precision=float32", "--config.data.source=synthetic",
            "--config.data.synthetic_train_size=256", "--config.data.synthetic_test_size=32",
            "--config.data.global_batch_size=16", "--config.trainer.train_steps=100000",
            "--config.trainer.steps_per_loop=5", "--config.trainer.log_every=5",
            "--config.trainer.checkpoint_every=100000"]
    procs, logs = [], [tmp_path / f"launch{i}.log" for i in range(2)]
    for i in range(2):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}}))
        procs.append(subprocess.Popen(args, cwd=ROOT, env=env,
                                      stdout=open(logs[i], "w"), stderr=subprocess.STDOUT))
    deadline = time.time() + 180
    while time.time() < deadline and "step 10/" not in logs[0].read_text():
        time.sleep(0.5)
    procs[1].send_signal(signal.SIGTERM)
    codes = finish(procs, timeout=120)
    texts = [log.read_text() for log in logs]
    assert codes == [128 + signal.SIGTERM] * 2, texts[0][-2000:] + texts[1][-2000:]
    for text in texts:
        assert "Traceback" not in text and "Relaunch with the same --workdir" in text
    saved = checkpoints(tmp_path / "wd")
    assert len(saved) == 1
    for text in texts:  # the whole number: "at step 10" would also match "at step 100"
        assert re.search(rf"Stopped by .* at step {saved[0]};", text), text[-2000:]


def test_a_divergence_is_diagnosed_on_every_worker_and_reported_by_the_chief(tmp_path):
    """The made-to-fail float16 Dense (tests/support/made_to_fail.py) on two workers: both
    replay the steps (they hold collectives), and both end with the chief's diagnosis."""
    script = os.path.join(ROOT, "tests", "support", "multi_worker_diverge_main.py")
    workdir = tmp_path / "wd"
    codes = finish(start_workers(workdir, tmp_path, script=script, out="txt"), timeout=240)
    logs = [open(tmp_path / f"worker{i}.log").read() for i in range(2)]
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    diagnosis = json.load(open(workdir / "diagnosis.json"))
    assert (diagnosis["layer"], diagnosis["pass"]) == ("made_to_fail/overflow", "forward")
    for i in range(2):
        assert "'made_to_fail/overflow'" in open(tmp_path / f"worker{i}.txt").read()
