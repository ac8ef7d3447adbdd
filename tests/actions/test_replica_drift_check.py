"""`trainer.consistency_every`: replicas that drift apart are named and stop the run."""

import json
import re

import pytest

from support import build, checkpoint_steps, tiny_config, two_replicas
from support.replica_drift import OneReplicaDrifts
from trainer.modes import train as train_mode
from trainer.actions.consistency_check import ConsistencyCheck, ReplicasDiverged

DRIFTING = "seed_cnn/dense_1/bias"


def drift_gap(message, replica):
    """The largest difference the message gives for DRIFTING on `replica`."""
    match = re.search(rf"{DRIFTING}: .*{replica} by up to ([0-9.e+-]+)", message)
    assert match, message
    return float(match.group(1))


def test_a_replica_that_drifts_is_named_and_the_checked_checkpoint_kept(tmp_path):
    config = tiny_config(**{"trainer.consistency_every": 5, "trainer.checkpoint_every": 10,
                            "trainer.eval_every": 0, "trainer.train_steps": 20})
    trainer = build(config, tmp_path, two_replicas())
    controller = train_mode.controller(trainer, evaluate=False,
                                     actions=[OneReplicaDrifts(DRIFTING, at=12)])
    with pytest.raises(ReplicasDiverged) as error:
        controller.train()
    message = str(error.value)
    print(message)
    # found at the first check after the drift, which the ones at 5 and 10 did not see
    assert message.startswith("Replicas disagree at step 15: 1 of 23 variables differ")
    assert drift_gap(message, "replica 1") == pytest.approx(1e-6, rel=0.01)
    assert "The last check that found them equal: step 10" in message
    assert checkpoint_steps(tmp_path / "checkpoints") == [10]  # nothing written after
    assert f"({tmp_path}/checkpoints/ckpt-10)" in message
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped"].startswith("ReplicasDiverged: Replicas disagree at step 15")
    assert controller.actions[0].last_equal == 10


def test_without_drift_the_check_passes_at_its_steps_and_before_saves(tmp_path, monkeypatch):
    checked = []
    original = ConsistencyCheck.__call__
    monkeypatch.setattr(ConsistencyCheck, "__call__", lambda self, controller, step, logs: (
        checked.append(step), original(self, controller, step, logs)))
    config = tiny_config(**{"trainer.consistency_every": 10, "trainer.checkpoint_every": 4,
                            "trainer.eval_every": 6, "trainer.train_steps": 13})
    controller = train_mode.controller(build(config, tmp_path, two_replicas()))
    controller.train()
    assert checked == [4, 6, 8, 10, 12, 13]
    assert controller.actions[0].last_equal == 13


def test_one_replica_has_nothing_to_compare(tmp_path, caplog):
    caplog.set_level("INFO")
    config = tiny_config(**{"trainer.consistency_every": 5, "trainer.train_steps": 5})
    build(config, tmp_path).train(evaluate=False)
    assert "trainer.consistency_every=5: one replica, nothing to compare." in caplog.text


def test_the_fingerprint_sees_changes_a_plain_sum_would_cancel():
    import numpy as np
    import tensorflow as tf
    from trainer.actions.consistency_check import bit_sum
    x = np.linspace(0.5, 2.0, 8, dtype=np.float32)
    up_down = x.copy()
    up_down[2] = np.nextafter(x[2], np.float32(3))   # +1 ulp (same exponent: bits + 1)
    up_down[5] = np.nextafter(x[5], np.float32(0))   # -1 ulp (bits - 1)
    swapped = x[[1, 0, 2, 3, 4, 5, 6, 7]]
    base = int(bit_sum(tf.constant(x)))
    assert base == int(bit_sum(tf.constant(x.copy())))
    assert int(bit_sum(tf.constant(up_down))) != base
    assert int(bit_sum(tf.constant(swapped))) != base
