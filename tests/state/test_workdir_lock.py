"""The workdir lock: a live run is never taken over, a dead one never blocks, in PID
namespaces (containers, Kubernetes pods) too, and on filesystems without OS locks."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support import ROOT
from trainer.state import lease_lock, workdir_lock
from trainer.state.workdir_lock import WorkdirLock, lock_holder

# A process that takes the lock of argv[1], says so on stdout and holds it (argv[2] s).
# The module is loaded from its file, without the trainer package's TensorFlow imports.
HOLDER = textwrap.dedent("""
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("workdir_lock", %r)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    WorkdirLock = module.WorkdirLock
    try:
        lock = WorkdirLock(sys.argv[1]).acquire()
    except RuntimeError as e:
        print("refused:", e, flush=True)
        sys.exit(3)
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    lock.release()
""") % os.path.join(ROOT, "trainer", "state", "workdir_lock.py")


def _unshare_works():
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                          capture_output=True).returncode == 0


needs_unshare = pytest.mark.skipif(not _unshare_works(),
                                   reason="unshare --pid needs root (CI runs as root)")


def _holder(workdir, seconds, namespace=False, **popen):
    """A HOLDER process; with `namespace`, PID 1 of a new PID namespace (as in a pod)."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"] \
        if namespace else []
    return subprocess.Popen(prefix + [sys.executable, "-c", HOLDER, str(workdir), str(seconds)],
                            stdout=subprocess.PIPE, text=True, **popen)


def _wait_locked(proc):
    line = proc.stdout.readline()
    assert line.startswith("locked"), line


@pytest.mark.e2e
@needs_unshare
def test_a_killed_pid_1_of_a_pod_does_not_block_its_relaunch(tmp_path):
    # (a) A pod keeps its hostname and the trainer is PID 1 again after a relaunch.
    first = _holder(tmp_path, 600, namespace=True)
    _wait_locked(first)
    first.send_signal(signal.SIGKILL)  # unshare dies; the kernel kills its child, PID 1
    first.wait(timeout=30)
    relaunch = _holder(tmp_path, 0, namespace=True)
    out, _ = relaunch.communicate(timeout=120)
    assert relaunch.returncode == 0 and out.startswith("locked"), out


@pytest.mark.e2e
@needs_unshare
def test_a_live_run_in_another_pid_namespace_is_not_taken_over(tmp_path):
    # (b) The owner's pid means nothing in the other namespace.
    owner = _holder(tmp_path, 600)
    try:
        _wait_locked(owner)
        other = _holder(tmp_path, 0, namespace=True)
        out, _ = other.communicate(timeout=120)
        assert other.returncode == 3 and f"held by pid {owner.pid}" in out, out
    finally:
        owner.kill()
        owner.wait()


@pytest.mark.e2e
def test_of_launches_racing_for_a_stale_lock_exactly_one_gets_it(tmp_path):
    # (c) A lock left by a dead run, and three launches taking it over at once: one gets it
    # (and keeps it while the others try), the others are refused, and no release
    # removes a lock that another holds.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(f'{{"pid": {dead.pid}, "host": "{os.uname()[1]}"}}')
    go = tmp_path / "go"
    racer = "import os\n" + HOLDER.replace(
        "try:", f"print('ready', flush=True)\nwhile not os.path.exists({str(go)!r}): pass\n"
        "try:", 1)
    racers = [subprocess.Popen([sys.executable, "-c", racer, str(tmp_path),
                                str(WorkdirLock.RETRY_SECONDS + 4)],
                               stdout=subprocess.PIPE, text=True) for _ in range(3)]
    assert [p.stdout.readline() for p in racers] == ["ready\n"] * 3  # (their imports)
    go.write_text("")
    outs = [p.communicate(timeout=120)[0] for p in racers]
    assert sorted(o.split(":")[0].strip() for o in outs) == [
        "locked", "refused", "refused"], outs
    assert not (tmp_path / ".lock").exists()  # released by its one holder


def test_an_unheld_lock_file_empty_or_not_is_taken_and_a_held_one_reported(tmp_path,
                                                                           caplog):
    (tmp_path / ".lock").write_text("")  # a power loss before its owner wrote it
    with WorkdirLock(str(tmp_path), mode="train") as lock:
        assert lock.held
        assert lock_holder(str(tmp_path), ".lock")["mode"] == "train"
    assert lock_holder(str(tmp_path), ".lock") is None
    assert not any("stale" in r.getMessage() for r in caplog.records)


@pytest.fixture
def quick_leases(monkeypatch):
    monkeypatch.setattr(lease_lock.LeaseLock, "HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setattr(lease_lock.LeaseLock, "LEASE_SECONDS", 1.5)
    monkeypatch.setattr(lease_lock.LeaseLock, "SETTLE_SECONDS", 0.1)


def test_a_renewed_lease_is_never_taken_over(quick_leases):
    workdir = "ram://lease_live"
    with WorkdirLock(workdir, mode="train"):
        time.sleep(0.5)  # a few renewals
        with pytest.raises(RuntimeError, match=rf"in use.*pid {os.getpid()}.*renews"):
            WorkdirLock(workdir).acquire()
        assert lock_holder(workdir, ".lock")["mode"] == "train"
    assert lock_holder(workdir, ".lock") is None


@pytest.mark.parametrize("left", ['{"pid": 1, "host": "gone", "token": "t", "beat": 7}', ""])
def test_a_lease_no_one_renews_is_taken_over_once_it_expires(quick_leases, caplog, left):
    workdir = f"ram://lease_dead_{len(left)}"
    with lease_lock.gfile.GFile(f"{workdir}/.lock", "w") as f:
        f.write(left)
    with WorkdirLock(workdir) as lock:
        assert lock.held
    assert any("unchanged for 2 s, so its run is gone" in r.getMessage()
               for r in caplog.records)


def test_a_local_filesystem_without_flock_takes_a_lease_at_once(tmp_path, quick_leases,
                                                                 monkeypatch, caplog):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(workdir_lock.fcntl, "flock", no_locks)
    with WorkdirLock(str(tmp_path), mode="train") as lock:
        assert lock.held and "token" in (tmp_path / ".lock").read_text()  # the lease's
    assert not (tmp_path / ".lock").exists()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "has no OS locks" in messages
    assert "Taking over" not in messages  # (its own empty file was never watched)
