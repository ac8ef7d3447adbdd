"""A missing, damaged or unreadable checkpoint state file never restarts a run at step 0."""

import hashlib
import itertools
import os
import shutil

import pytest
import tensorflow as tf

from support import build, checkpoint_steps, tiny_config
from trainer.modes import continuous_eval as evaluator
from trainer.state import checkpoint_state

CONFIG = {"trainer.train_steps": 20, "trainer.checkpoint_every": 10,
          "trainer.async_checkpoint": "off"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A workdir trained to step 20: ckpt-10 and ckpt-20."""
    workdir = tmp_path_factory.mktemp("trained")
    build(tiny_config(**CONFIG), workdir).train(evaluate=False)
    assert checkpoint_steps(workdir / "checkpoints") == [10, 20]
    return workdir


def _digests(directory):
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
            for name in os.listdir(directory) if name.startswith("ckpt-")}


def _damage(state):
    state.write_text("model_checkpoint_path: \"ckpt-20\"\nall_model_che\x00\x17 garbage {")


def _not_text(state):
    state.write_bytes(b"\xff\xfe\x00model_checkpoint_path" + bytes(range(128, 256)))


def _delete(state):
    state.unlink()


def _empty(state):
    state.write_text("")


@pytest.mark.xdist_group("checkpoint_state")
@pytest.mark.parametrize("harm", [_damage, _not_text, _delete, _empty])
def test_a_relaunch_over_a_harmed_state_file_continues_from_the_newest(trained, tmp_path,
                                                                         harm, caplog):
    caplog.set_level("INFO")
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    checkpoints = tmp_path / "checkpoints"
    before = _digests(checkpoints)
    harm(checkpoints / "checkpoint")
    relaunch = build(tiny_config(**{**CONFIG, "trainer.train_steps": 30}), tmp_path)
    relaunch.train(evaluate=False)
    # It restored step 20, not 0, and trained the 10 steps left.
    assert any("Restored" in r.getMessage() and "ckpt-20 (step 20)" in r.getMessage()
               for r in caplog.records)
    assert int(relaunch.step.numpy()) == 30
    assert any("is not usable" in r.getMessage() and "ckpt-10, ckpt-20" in r.getMessage()
               for r in caplog.records)
    # The old checkpoints are intact and the state lists them again, so they rotate.
    assert checkpoint_steps(checkpoints) == [10, 20, 30]
    after = _digests(checkpoints)
    assert {n: after[n] for n in before} == before


@pytest.mark.xdist_group("checkpoint_state")
def test_a_transient_read_error_is_retried_before_anything_is_decided(trained, tmp_path,
                                                                        monkeypatch, caplog):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    real, failures = checkpoint_state._read, []

    def flaky(path):
        if len(failures) < checkpoint_state.READ_ATTEMPTS - 1:
            failures.append(path)
            raise tf.errors.UnavailableError(None, None, "connection reset")
        return real(path)

    monkeypatch.setattr(checkpoint_state, "_read", flaky)
    monkeypatch.setattr(checkpoint_state, "RETRY_SECONDS", 0.0)
    assert checkpoint_state.listed_checkpoints(str(tmp_path / "checkpoints"))[-1].endswith(
        "ckpt-20")
    assert len(failures) == checkpoint_state.READ_ATTEMPTS - 1
    assert not any("is not usable" in r.getMessage() for r in caplog.records)


@pytest.mark.xdist_group("checkpoint_state")
def test_a_state_file_that_never_reads_resumes_from_the_files(trained, tmp_path, monkeypatch,
                                                              caplog):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)

    def broken(path):
        raise tf.errors.UnavailableError(None, None, "connection reset")

    monkeypatch.setattr(checkpoint_state, "_read", broken)
    monkeypatch.setattr(checkpoint_state, "RETRY_SECONDS", 0.0)
    caplog.set_level("INFO")
    before = _digests(tmp_path / "checkpoints")
    relaunch = build(tiny_config(**{**CONFIG, "trainer.train_steps": 30}), tmp_path)
    relaunch.train(evaluate=False)
    assert any("cannot be read after 4 attempts (connection reset)" in r.getMessage()
               for r in caplog.records)
    assert any("Restored" in r.getMessage() and "ckpt-20 (step 20)" in r.getMessage()
               for r in caplog.records)
    assert int(relaunch.step.numpy()) == 30
    assert checkpoint_steps(tmp_path / "checkpoints") == [10, 20, 30]
    after = _digests(tmp_path / "checkpoints")
    assert {n: after[n] for n in before} == before


@pytest.mark.xdist_group("checkpoint_state")
def test_a_save_never_replaces_a_readable_checkpoint_of_its_number(trained, tmp_path):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    before = _digests(tmp_path / "checkpoints")
    fresh = build(tiny_config(**CONFIG), tmp_path)  # not restored: at step 0
    fresh.step.assign(10)
    with pytest.raises(RuntimeError, match=r"Refusing to save .*ckpt-10: a readable"):
        fresh.checkpoints.save()
    assert _digests(tmp_path / "checkpoints") == before


@pytest.mark.xdist_group("checkpoint_state")
def test_a_continuous_evaluator_sees_checkpoints_past_a_damaged_state_file(trained, tmp_path):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    _damage(tmp_path / "checkpoints" / "checkpoint")
    seen = itertools.islice(evaluator._new_checkpoints(str(tmp_path / "checkpoints"), 5.0), 1)
    assert [os.path.basename(p) for p in seen] == ["ckpt-20"]
