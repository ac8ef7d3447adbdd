"""Multi-worker launches: `--local_workers=N` and a Slurm step's environment."""

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

from support import ROOT, checkpoint_steps
from trainer.runtime import local_workers

TINY = ["--config=configs/cifar.py", "--config.data.source=synthetic",
        "--config.precision=float32", "--config.data.global_batch_size=16",
        "--config.data.synthetic_train_size=256", "--config.data.synthetic_test_size=32",
        "--config.trainer.train_steps=10", "--config.trainer.steps_per_loop=5",
        "--config.trainer.log_every=5", "--config.trainer.jit_compile=off",
        "--config.distribution.collective_timeout_seconds=30", "--mode=train"]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


DRIFT_CONFIG = """
from configs import cifar

def get_config():
    c = cifar.get_config()
    c.actions.drift = dict(action="replica_drift.OneReplicaDrifts",
                           name="seed_cnn/dense_1/bias", at=5)
    return c
"""


@pytest.mark.e2e
def test_local_workers_run_a_cluster_and_the_check_names_a_worker_that_drifts(tmp_path):
    """Two workers of one command train in step until the last one's copy of a variable is
    changed at step 5; the consistency check stops both at step 10, keeping ckpt-5."""
    (tmp_path / "drift.py").write_text(DRIFT_CONFIG)
    shutil.copy(os.path.join(ROOT, "tests", "support", "replica_drift.py"), tmp_path)
    run = subprocess.run([sys.executable, "launch.py", "--local_workers=2",
                          f"--config={tmp_path}/drift.py", *TINY[1:],
                          "--config.trainer.consistency_every=5",
                          "--config.trainer.checkpoint_every=5",
                          f"--workdir={tmp_path}/run"], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=300)
    lines = run.stderr.splitlines()
    # The ports the workers open are told, with what anyone reaching them can do.
    told = re.search(r"\[local_workers\] The gRPC servers of the 2 workers listen on ports "
                     r"(\d+), (\d+) on every network interface .*can run any TensorFlow "
                     r"graph", run.stderr)
    assert told, run.stderr[-3000:]
    for i in range(2):
        assert any(line.startswith(f"[worker {i}] ") and "This worker's MultiWorkerMirrored "
                   "gRPC server listens on port" in line for line in lines)
    for i in range(2):
        assert any(line.startswith(f"[worker {i}] ") and "Cluster from tf_config: 2 "
                   "worker(s) (localhost:" in line and f"this process is worker {i}; 1 "
                   "replica(s) per worker" in line for line in lines), run.stderr[-3000:]
        assert any(line.startswith(f"[worker {i}] ") and "Replicas disagree at step 10: 1 of "
                   in line for line in lines), run.stderr[-3000:]
    assert any(line.startswith("[worker 0] ") and "step 5/10" in line for line in lines)
    assert "seed_cnn/dense_1/bias: replica 1 (worker 1) by up to 1e-06" in run.stderr
    assert "Traceback" not in run.stderr
    assert run.returncode == 1
    assert checkpoint_steps(tmp_path / "run" / "checkpoints") == [5]


FAKE_WORKER = """
import json, os, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print("up", flush=True)
if index == 1:
    sys.exit(3)
time.sleep(120)  # as a worker waiting on a dead peer's collectives
"""


@pytest.mark.e2e
def test_a_failed_local_worker_stops_the_others_and_gives_its_status(tmp_path, capfd):
    script = tmp_path / "worker.py"
    script.write_text(FAKE_WORKER)
    assert local_workers.run(3, [str(script), "--local_workers=3"]) == 3
    err = capfd.readouterr().err
    assert "[worker 0] up" in err and "[worker 2] up" in err
    assert "worker 1 exited with status 3: stopping 2 other worker(s)" in err


def consecutive_free_ports(n):
    """A base port with the n ports from it free now."""
    for _ in range(50):
        base = local_workers.free_ports(1)[0]
        sockets = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                sockets.append(s)
                s.bind(("localhost", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no consecutive free ports")


@pytest.mark.e2e
def test_a_slurm_step_environment_gives_the_cluster(tmp_path):
    """Two tasks of one srun step on one node, with the variables srun sets."""
    base = consecutive_free_ports(2)
    procs = []
    for rank in range(2):
        env = dict(ENV, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
                   SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2", SLURM_STEP_NODELIST="localhost",
                   SLURM_JOB_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="2",
                   SLURM_TASKS_PER_NODE="2", SLURM_NODEID="0")
        env.pop("TF_CONFIG", None)
        procs.append(subprocess.Popen(
            [sys.executable, "launch.py", *TINY, f"--workdir={tmp_path}",
             "--config.distribution.cluster=slurm", f"--config.distribution.port_base={base}"],
            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True))
    logs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    for rank, log in enumerate(logs):
        assert (f"Cluster from slurm: 2 worker(s) (localhost:{base}, localhost:{base + 1}); "
                f"this process is worker {rank}; 1 replica(s) per worker.") in log
    assert "step 10/10" in logs[0]


@pytest.mark.e2e
def test_the_kubernetes_manifest_gives_each_pod_its_tf_config():
    import json
    import re
    from trainer.runtime import kubernetes
    manifest = open(os.path.join(ROOT, "examples", "kubernetes.yaml")).read()
    env = dict(re.findall(r"\{name: (TFTRAINER_\w+), value: \"?([\w-]+)\"?\}", manifest))
    assert "python -m trainer.runtime.kubernetes" in manifest
    workers = int(env["TFTRAINER_WORKERS"])
    assert f"completions: {workers}" in manifest and f"parallelism: {workers}" in manifest
    assert f"subdomain: {env['TFTRAINER_SERVICE']}" in manifest
    configs = [json.loads(kubernetes.from_environment(dict(env, JOB_COMPLETION_INDEX=str(i))))
               for i in range(workers)]
    hosts = ["tftrainer-0.tftrainer-workers:2222", "tftrainer-1.tftrainer-workers:2222"]
    for i, config in enumerate(configs):
        assert config == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}
    # Only the job's own pods reach the workers' port.
    policy = next(d for d in yaml.safe_load_all(manifest) if d["kind"] == "NetworkPolicy")
    pods = {"job-name": next(d for d in yaml.safe_load_all(manifest)
                             if d["kind"] == "Job")["metadata"]["name"]}
    assert policy["spec"]["podSelector"]["matchLabels"] == pods
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": pods}}]
    assert rule["ports"] == [{"port": int(env["TFTRAINER_PORT"])}]
    run = subprocess.run([sys.executable, "-m", "trainer.runtime.kubernetes"], cwd=ROOT,
                         env=dict(ENV, JOB_COMPLETION_INDEX="1", **env), capture_output=True,
                         text=True, timeout=60)
    assert json.loads(run.stdout) == configs[1]


def test_gradients_all_reduced_in_bfloat16_train_as_float32_ones_do(tmp_path):
    """Half the bytes on the wire: a coarser sum (not bitwise the float32 one), the same
    training to bfloat16's precision."""
    import numpy as np
    from support import build, tiny_config, two_replicas
    runs = {}
    for dtype in ("float32", "bfloat16"):
        trainer = build(tiny_config(**{"distribution.all_reduce_dtype": dtype,
                                       "trainer.train_steps": 5}), tmp_path / dtype,
                        two_replicas())
        trainer.train(evaluate=False)
        runs[dtype] = np.concatenate([w.numpy().ravel() for w in trainer.model.weights])
    difference = np.abs(runs["bfloat16"] - runs["float32"])
    assert 0 < difference.max() < 0.05 * np.abs(runs["float32"]).max()


def test_an_overflow_all_reduced_in_bfloat16_still_arrives_as_inf():
    """So the loss scale's finiteness check, after the all-reduce, still sees it."""
    import numpy as np
    import tensorflow as tf
    from support import two_replicas
    from trainer.runtime.distribute import sum_over_replicas
    strategy = two_replicas()

    def step():
        replica = tf.distribute.get_replica_context()
        first = tf.equal(replica.replica_id_in_sync_group, 0)
        grad = tf.where(first, tf.constant([np.inf, 1.5]), tf.constant([1.0, 1.25]))
        grads, loss = sum_over_replicas(replica, [grad], tf.constant(0.5), "bfloat16")
        return grads[0], loss

    grad, loss = tf.function(lambda: strategy.run(step))()
    grad, loss = grad.values[0].numpy(), loss.values[0].numpy()
    assert grad.dtype == np.float32 and np.isinf(grad[0]) and grad[1] == 2.75 and loss == 1.0
