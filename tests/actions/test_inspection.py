"""What a user inspects: TensorBoard through the real server, HParams, the profiler."""

import io
import sys
import urllib.parse
import urllib.request

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from trainer.task import get_task
from support import build, scalars, tiny_config
from support.tensorboard_server import get, serving

pytestmark = pytest.mark.xdist_group("inspection")  # one test process makes the run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A short run: 8 steps, logs and evals every 4, a profile of steps 3 to 5."""
    workdir = tmp_path_factory.mktemp("runs") / "run1"
    config = tiny_config(**{"trainer.train_steps": 8, "trainer.steps_per_loop": 4,
                            "trainer.log_every": 4, "trainer.eval_every": 4,
                            "trainer.profile_steps": (3, 5)})
    trainer = build(config, workdir)
    last_eval = trainer.train()
    return workdir, last_eval


@pytest.mark.e2e
def test_tensorboard_serves_what_the_trainer_logged(run):
    workdir, last_eval = run
    with serving(workdir.parent, "/data/runs",
                 lambda runs: {"run1/train", "run1/eval"} <= set(runs)) as port:
        tags = get(port, "/data/plugin/scalars/tags")
        assert {"loss", "accuracy", "learning_rate", "examples_per_sec"} <= set(
            tags["run1/train"])
        assert {"loss", "accuracy"} <= set(tags["run1/eval"])
        logged = scalars(workdir, "train")["loss"]
        served = get(port, "/data/plugin/scalars/scalars?" + urllib.parse.urlencode(
            {"run": "run1/train", "tag": "loss"}))
        assert [(step, value) for _, step, value in served] == logged
        assert [s for s, _ in logged] == [4, 8]
        served = get(port, "/data/plugin/scalars/scalars?" + urllib.parse.urlencode(
            {"run": "run1/eval", "tag": "accuracy"}))
        assert served[-1][1] == 8
        assert served[-1][2] == pytest.approx(last_eval["accuracy"], rel=1e-6)

        # HParams: the run is one session, its config fields the hparams, eval/ the metrics
        experiment = get(port, "/data/plugin/hparams/experiment", {"experimentName": ""})
        hparams = {h["name"] for h in experiment["hparamInfos"]}
        assert {"trainer.train_steps", "optimizer.learning_rate", "precision"} <= hparams
        metrics = {(m["name"].get("group"), m["name"]["tag"])
                   for m in experiment["metricInfos"]}
        assert ("eval", "accuracy") in metrics


def test_the_first_training_batch_is_shown_as_one_grid(run):
    workdir, _ = run
    images = [v for path in tf.io.gfile.glob(str(workdir / "train/events.*"))
              for e in tf.compat.v1.train.summary_iterator(path) for v in e.summary.value
              if v.tag == "input_batch"]
    assert len(images) == 1
    grid = tf.io.decode_png(tf.make_ndarray(images[0].tensor)[2]).numpy()
    assert grid.shape == (6 * 32, 6 * 32, 3)  # 32 images: 6 columns, 6 rows
    config = tiny_config()
    task = get_task(config)
    features, _ = next(iter(task.build_inputs("train", tf.distribute.InputContext(), 0)))
    first = np.round(task.display_images(features)[0].numpy() * 255)
    np.testing.assert_allclose(grid[:32, :32], first, atol=1)  # the pixels, not the floats


def profiled_steps(trace):
    """The first step of each host call of the train loop in the trace."""
    space = xplane_pb2.XSpace()
    with open(trace, "rb") as f:
        space.ParseFromString(f.read())
    marked = []
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                if plane.event_metadata[event.metadata_id].name == "train":
                    stats = {plane.stat_metadata[s.metadata_id].name: s.int64_value
                             for s in event.stats}
                    marked.append(stats["step_num"])
    return sorted(marked)


def test_the_profile_covers_exactly_the_asked_steps(run):
    workdir, _ = run
    (trace,) = tf.io.gfile.glob(str(workdir / "train/plugins/profile/*/*.xplane.pb"))
    # steps_per_loop=4, so the loop was split at the window: calls for steps 3-4 and 5
    assert profiled_steps(trace) == [3, 5]


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_a_progress_bar_on_a_terminal_only(tmp_path, monkeypatch, capsys, tty):
    if tty:
        monkeypatch.setattr(sys, "stdout", Terminal())
    trainer = build(tiny_config(**{"trainer.train_steps": 6, "trainer.steps_per_loop": 2,
                                   "trainer.log_every": 3}), tmp_path)
    results = trainer.train()
    shown = sys.stdout.getvalue() if tty else capsys.readouterr().out
    if tty:  # redrawn in place at each loop boundary, with the loss once logged
        assert shown.count("\r") >= 3 and "6/6" in shown
        assert "loss:" in shown and "ex/s:" in shown
        # the eval's bar: one compiled call per batch, the same results
        batches = -(-tiny_config().data.synthetic_test_size // 32)
        assert f"{batches}/Unknown" in shown
        assert trainer.evaluate() == pytest.approx(results, rel=1e-5)
    else:
        assert "\r" not in shown and "\b" not in shown and "6/6" not in shown


def test_a_profile_from_the_first_step(tmp_path):
    build(tiny_config(**{"trainer.train_steps": 3, "trainer.steps_per_loop": 3,
                         "trainer.profile_steps": (1, 1)}), tmp_path).train(evaluate=False)
    (trace,) = tf.io.gfile.glob(str(tmp_path / "train/plugins/profile/*/*.xplane.pb"))
    assert profiled_steps(trace) == [1]  # the loop was split after step 1
