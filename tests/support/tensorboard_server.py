"""The real `tensorboard` binary serving a log directory, and its JSON routes."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, route, body=None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{route}", data=body and json.dumps(body).encode(),
        headers={"X-XSRF-Protected": "1", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def serving(logdir, route, loaded, timeout=90):
    """Yields the port of TensorBoard serving `logdir`, once `loaded(get(port, route))`."""
    port = free_port()
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "tensorboard"),
         f"--logdir={logdir}", "--host=127.0.0.1", f"--port={port}",
         "--load_fast=false", "--reload_interval=1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, answer = time.monotonic() + timeout, None
        while True:
            assert server.poll() is None, server.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"TensorBoard did not load {route}: {answer}"
            time.sleep(1)
            try:
                answer = get(port, route)
            except OSError:
                continue  # not listening yet
            if loaded(answer):
                break
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)
