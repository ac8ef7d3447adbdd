"""trainer.debug: the steps run eagerly (Python inside a model works), or dumped for
TensorBoard's Debugger V2; either gives the compiled run's losses."""

import os
import urllib.parse

import keras
import numpy as np
import pytest
import tensorflow as tf

from support import build, scalars, tiny_config, two_replicas
from support.array_task import ArrayTask
from support.made_to_fail import FAILING_STEP, MadeToFail, made_to_fail_config
from support.tensorboard_server import get, serving
from trainer import Trainer
from trainer.runtime.debug import one_replica
from trainer.runtime.precision import set_policy


@pytest.fixture
def eager_off_after():
    yield
    tf.config.run_functions_eagerly(False)


def losses(tmp_path, name, **overrides):
    config = tiny_config(**{"trainer.train_steps": 4, "trainer.steps_per_loop": 2,
                            "trainer.log_every": 1, "trainer.per_step_summaries": True,
                            **overrides})
    build(config, tmp_path / name).train(evaluate=False)
    return scalars(tmp_path / name, "train")["loss"]


def test_eager_and_dump_runs_give_the_compiled_losses(tmp_path, eager_off_after):
    compiled = losses(tmp_path, "compiled")
    eager = losses(tmp_path, "eager", **{"trainer.debug": "eager"})
    assert tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(False)
    dumped = losses(tmp_path, "dump", **{"trainer.debug": "dump",
                                         "trainer.debug_steps": (2, 3)})
    assert [s for s, _ in compiled] == [1, 2, 3, 4]
    for other in (eager, dumped):  # up to float reduction order
        np.testing.assert_allclose([v for _, v in other], [v for _, v in compiled], rtol=1e-5)
    (dump,) = os.listdir(tmp_path / "dump" / "debug")
    assert os.listdir(tmp_path / "dump" / "debug" / dump)


class Peek(keras.layers.Layer):
    """Reads its input's values in Python: only possible when the step runs eagerly."""

    seen = []

    def compute_output_shape(self, input_shape):
        return input_shape

    def call(self, x):
        Peek.seen.append(float(np.abs(x.numpy()).max()))
        return x


def peeking_model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), Peek(),
                             keras.layers.Dense(1)])


def peeking_trainer(tmp_path, **overrides):
    config = tiny_config(**{"data.global_batch_size": 4, "trainer.train_steps": 3,
                            "trainer.steps_per_loop": 3, **overrides})
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 3)).astype("float32"), np.zeros((12, 1), "float32")
    set_policy("float32", tf.distribute.get_strategy())
    return Trainer(config, ArrayTask(config, x, y, peeking_model),
                   tf.distribute.get_strategy(), str(tmp_path))


def test_eager_lets_python_run_inside_the_model(tmp_path, eager_off_after):
    Peek.seen = []
    peeking_trainer(tmp_path / "eager", **{"trainer.debug": "eager"}).train(evaluate=False)
    assert len(Peek.seen) >= 3 and all(v > 0 for v in Peek.seen)  # one or more per step
    tf.config.run_functions_eagerly(False)
    with pytest.raises((AttributeError, NotImplementedError)):  # compiled: a graph tensor
        peeking_trainer(tmp_path / "compiled").train(evaluate=False)


def test_eager_refuses_what_it_cannot_run(tmp_path):
    config = tiny_config(**{"trainer.debug": "eager"})
    with pytest.raises(ValueError, match="one replica.*distribution.strategy=default"):
        build(config, tmp_path, strategy=two_replicas())
    assert not tf.config.functions_run_eagerly()
    config.distribution.strategy = "tpu"
    with pytest.raises(ValueError, match="cannot run on a TPU"):
        one_replica(config.distribution)
    config.distribution.strategy = "mirrored"
    one_replica(config.distribution)
    assert config.distribution.strategy == "default"
    with pytest.raises(ValueError, match=r"debug_steps=\(3, 1\) must be"):
        build(tiny_config(**{"trainer.debug": "dump", "trainer.debug_steps": (3, 1)}),
              tmp_path)


@pytest.mark.e2e
def test_tensorboards_debugger_v2_serves_the_dump_of_a_nan(tmp_path):
    """The made-to-fail log layer's step, dumped, as TensorBoard's Debugger V2 serves it:
    an alert names the op that went inf."""
    config = made_to_fail_config("log_of_zero", **{
        "trainer.max_nonfinite_steps": 1, "trainer.diagnose": False,
        "trainer.debug": "dump", "trainer.debug_steps": (FAILING_STEP, FAILING_STEP)})
    set_policy(config.precision, tf.distribute.get_strategy())
    trainer = Trainer(config, MadeToFail(config, "log_of_zero"),
                      tf.distribute.get_strategy(), str(tmp_path))
    with pytest.raises(FloatingPointError):
        trainer.train(evaluate=False)
    query = urllib.parse.urlencode({"run": "__default_debugger_run__", "begin": 0, "end": -1})
    alerts_route = f"/data/plugin/debugger-v2/alerts?{query}"
    # (the plugin reads the dump in the background: its alerts come once it has)
    (dump,) = (tmp_path / "debug").iterdir()  # one launch, one worker: one run
    assert dump.name.endswith("-worker0")
    with serving(dump, alerts_route, lambda a: a["num_alerts"] > 0) as port:
        alerts = get(port, alerts_route)["alerts"]
        ops = {(a["op_type"], a["alert_type"]) for a in alerts}
        assert ("Log", "InfNanAlert") in ops, alerts  # the log of 0, at the step dumped
        traces = get(port, f"/data/plugin/debugger-v2/graph_execution/digests?{query}")
        assert traces["num_digests"] > 0
