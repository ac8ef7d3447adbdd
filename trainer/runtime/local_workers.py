"""`--local_workers=N`: N worker processes of the same command on this machine, a
MultiWorkerMirrored cluster on localhost ports, to try multi-worker before a cluster.
Their gRPC servers listen on every interface, not only localhost (trainer/runtime/
open_ports.py): the command says so as it starts them.

Each worker gets a generated `TF_CONFIG` (free ports, task index i) and
`--config.distribution.strategy=multi_worker`; their output is streamed with a
`[worker i]` prefix. When one exits with an error the others are stopped (they would
wait on its collectives until `distribution.collective_timeout_seconds`) and the command
exits with that first failure's status; otherwise with the worst of theirs.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from trainer.runtime.open_ports import open_ports_message

POLL_SECONDS = 0.2


def free_ports(n):
    """n ports free on localhost now (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def worker_env(cluster, index, base=None):
    """The environment of worker `index` of `cluster` ({"worker": [host:port, ...]})."""
    return dict(os.environ if base is None else base, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))


def without_flag(argv, name):
    """argv without `--name=value` / `--name value`."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == f"--{name}":
            skip = True
        elif not arg.startswith(f"--{name}="):
            out.append(arg)
    return out


def _stream(proc, prefix, lock):
    for line in proc.stdout:
        with lock:
            sys.stderr.write(prefix + line)
            sys.stderr.flush()


def run(count, argv):
    """Runs the command `argv` (this process's, `--local_workers` removed) as `count`
    workers; returns the exit status to leave with: the first failure's, else the
    worst (a signal n as 128+n)."""
    if count < 2:
        raise ValueError(f"--local_workers={count}: a cluster needs 2 or more workers.")
    ports = free_ports(count)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    sys.stderr.write("[local_workers] " + open_ports_message(
        f"The gRPC servers of the {count} workers", ports) + "\n")
    command = [sys.executable, *without_flag(argv, "local_workers"),
               "--config.distribution.strategy=multi_worker"]
    lock = threading.Lock()
    procs, streams = [], []
    for i in range(count):
        procs.append(subprocess.Popen(command, env=worker_env(cluster, i),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1))
        streams.append(threading.Thread(target=_stream, args=(procs[-1], f"[worker {i}] ",
                                                              lock), daemon=True))
        streams[-1].start()
    forwarded = _forward_signals(procs)
    first_failure = None
    try:
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed and first_failure is None:
                first_failure = status(procs[failed[0]].returncode)
                _stop(procs, f"worker {failed[0]} exited with status {first_failure}")
            time.sleep(POLL_SECONDS)
    finally:
        for signum, handler in forwarded.items():
            signal.signal(signum, handler)
        for stream in streams:
            stream.join(timeout=5)
    if first_failure is None:  # (all ended within one poll)
        first_failure = next((status(p.returncode) for p in procs if p.returncode), None)
    return first_failure if first_failure is not None else 0


def status(returncode):
    """An exit status as a shell reports it: a signal n as 128+n."""
    return 128 - returncode if returncode < 0 else returncode


def _stop(procs, why):
    alive = [p for p in procs if p.poll() is None]
    if alive:
        sys.stderr.write(f"[local_workers] {why}: stopping {len(alive)} other worker(s).\n")
    for p in alive:
        p.terminate()  # SIGTERM: a worker that can still save does
    deadline = time.monotonic() + 30
    for p in alive:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()


def _forward_signals(procs):
    """SIGTERM / SIGINT to this process go to every worker (each saves and exits)."""
    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    return {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM,
                                                                  signal.SIGINT)}
