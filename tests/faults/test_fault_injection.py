"""The fault-injection harness: random SIGKILLs and SIGTERMs, relaunches, nothing lost."""

import pytest

from benchmarks import faults

pytestmark = pytest.mark.e2e  # the harness launches the runs it kills

JOB = ["--config=configs/cifar.py", "--config.data.source=synthetic",
       "--config.precision=float32", "--config.data.global_batch_size=16",
       "--config.data.synthetic_train_size=256", "--config.data.synthetic_test_size=32",
       "--config.trainer.steps_per_loop=5", "--config.trainer.log_every=5",
       "--config.trainer.checkpoint_every=10", "--config.trainer.eval_every=20",
       "--config.distribution.collective_timeout_seconds=20",
       "--config.trainer.deterministic=True"]  # (the harness adds it too: bitwise needs it)


def _check(report, kills, target):
    faults.print_report(report)  # shown when the test fails
    assert report["checks"] == {"final_step": True, "bitwise_equal": True, "no_hang": True,
                                "checkpoints_read": True}, report
    assert report["passed"] and report["kills"] == kills and report["values_compared"] > 10
    assert report["final_step"] == report["target_step"] == target
    # at least one relaunch resumed from a checkpoint, not from scratch
    assert report["recoveries"] >= 1 and any(r["restored_step"] > 0 for r in report["rows"])
    assert {r["signal"] for r in report["rows"]} == {"SIGKILL", "SIGTERM"}
    for row in report["rows"]:
        assert row["restored_step"] % 5 == 0 and row["restored_step"] <= target
        if row["signal"] == "SIGTERM":  # saved on the way out: nothing to redo
            assert row["steps_redone"] == 0 and row["exit_codes"][0] == 143
    assert report["goodput"]["launches"] == kills + 1
    assert report["goodput"]["steps_redone"] == report["steps_redone"]


def test_three_kills_on_one_host_end_bitwise_equal(tmp_path):
    report = faults.run(JOB + ["--config.distribution.strategy=default",
                               "--config.trainer.train_steps=200"],
                        str(tmp_path), kills=3, workers=1, seed=0)
    _check(report, 3, 200)


def test_two_kills_of_either_worker_of_two_end_bitwise_equal(tmp_path):
    report = faults.run(JOB + ["--config.trainer.train_steps=60"], str(tmp_path), kills=2,
                        workers=2, seed=1, hang_bound=60.0)
    _check(report, 2, 60)
    for row in report["rows"]:  # the other worker left in time, on SIGKILL too
        assert all(s <= 60.0 for s in row["peers_exit_seconds"].values())
