"""trainer.jit_compile: on, off, or auto (timed on the first launch where it can pay, stored
for the next)."""

import json
import re

import pytest
import tensorflow as tf

from support import build, tiny_config, two_replicas, zoo
from trainer.actions import jit_choice as jit_choice_loop
from trainer.runtime import settings as jit_choice


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A user cache of this test's own, and runs long enough to time XLA on a CPU."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(jit_choice_loop, "LONG_RUN_SECONDS", 0.0)


def auto_config(**overrides):
    # (Dense layers: XLA compiles them under the op determinism other tests turn on,
    # where it refuses MaxPool's gradient.)
    return zoo.zoo_config("dict_inputs", **{"trainer.jit_compile": "auto", **overrides})


def log_line(caplog, text):
    return next(r.getMessage() for r in caplog.records if text in r.getMessage())


def test_auto_times_both_keeps_the_faster_and_a_relaunch_reuses_it(tmp_path, caplog,
                                                                    own_cache):
    caplog.set_level("INFO")
    # One chunk of the 4 steps, then the choice (a checkpoint at step 2 would end the
    # first chunk there, and a switch to XLA would change steps 3 and 4).
    config = auto_config(**{"trainer.steps_per_loop": 4, "trainer.checkpoint_every": 4})
    trainer = build(config, tmp_path, two_replicas())
    assert trainer.jit_compile == "auto"
    trainer.train(evaluate=False)
    stored = json.load(open(tmp_path / "jit_compile.json"))
    line = log_line(caplog, "jit_compile=auto: jit_compile=")
    xla_ms, no_xla_ms = map(float, re.search(
        r"the pass takes ([0-9.]+) ms with XLA, ([0-9.]+) ms without", line).groups())
    assert "cached in" in line
    if xla_ms != no_xla_ms:  # (the log rounds to 0.01 ms)
        assert stored["jit_compile"] == (xla_ms < no_xla_ms)
    assert trainer.jit_compile is stored["jit_compile"]
    # The timing left no trace: the 4 steps (run without XLA, before the choice) are
    # those of a run told jit_compile=off.
    told = build(_config(config, "off"), tmp_path / "told", two_replicas())
    told.train(evaluate=False)
    for a, b in zip(trainer.model.weights, told.model.weights):
        assert (a.numpy() == b.numpy()).all(), a.path

    caplog.clear()
    config.trainer.train_steps = 6
    again = build(config, tmp_path, two_replicas())
    again.train(evaluate=False)
    assert again.jit_compile is stored["jit_compile"]
    assert not any("jit_compile=auto" in r.getMessage() for r in caplog.records)
    assert any("as chosen for this workdir before" in r.getMessage() for r in caplog.records)


def test_a_timing_in_the_user_cache_serves_a_new_run_of_the_same_model(tmp_path, caplog,
                                                                       monkeypatch, own_cache):
    caplog.set_level("INFO")
    timed = []
    real = jit_choice_loop._seconds_per_call
    monkeypatch.setattr(jit_choice_loop, "_seconds_per_call",
                        lambda trainer, xla: timed.append(xla) or real(trainer, xla))
    build(auto_config(), tmp_path / "first", two_replicas()).train(evaluate=False)
    assert timed == [False, True]
    first = json.load(open(tmp_path / "first" / "jit_compile.json"))["jit_compile"]
    caplog.clear()
    second = build(auto_config(), tmp_path / "second", two_replicas())
    second.train(evaluate=False)
    assert timed == [False, True] and second.jit_compile is first
    assert "as timed before for this model, batch, precision and device" in log_line(
        caplog, "jit_compile=auto: ")
    # another micro-batch is another pass: timed again
    build(auto_config(**{"data.global_batch_size": 16}), tmp_path / "third",
          two_replicas()).train(evaluate=False)
    assert timed == [False, True, False, True]


def test_a_short_run_on_a_cpu_times_nothing(tmp_path, caplog, monkeypatch):
    """Its first chunk runs without XLA and its pace says the run is short: no timing, on
    a first launch as on the next (a short run caches nothing)."""
    caplog.set_level("INFO")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    timed = []
    monkeypatch.setattr(jit_choice_loop, "_seconds_per_call",
                        lambda trainer, xla: timed.append(xla) or 0.01)
    for workdir in ("run", "again"):
        caplog.clear()
        trainer = build(auto_config(**{"trainer.train_steps": 5}), tmp_path / workdir)
        trainer.train(evaluate=False)
        assert timed == [] and trainer.jit_compile is False
        assert "off for the first chunk; its pace decides" in log_line(caplog, "first chunk")
        line = log_line(caplog, "jit_compile=auto: jit_compile=off")
        assert re.search(r"the first 2 steps took [0-9.]+ ms each without XLA \(tracing "
                         r"included\): 3 steps left, ~[0-9]+ s, too short to earn back timing XLA "
                         r"on a CPU", line), line
        assert json.load(open(tmp_path / workdir / "jit_compile.json"))["jit_compile"] is False


def test_a_long_run_on_a_cpu_switches_to_xla_after_its_first_chunk(tmp_path, caplog,
                                                                   monkeypatch, own_cache):
    """Timed at the end of the first chunk; the next chunk traces the loop again, and
    the ledger counts that chunk's tracing as compile time, not as training."""
    caplog.set_level("INFO")
    monkeypatch.setattr(jit_choice_loop, "_seconds_per_call",
                        lambda trainer, xla: 0.5 if xla else 1.0)
    trainer = build(auto_config(**{"trainer.train_steps": 8}), tmp_path)
    trainer.train(evaluate=False)
    assert trainer.jit_compile is True
    events = [json.loads(line) for line in open(tmp_path / "goodput.jsonl")]
    assert [e.get("traced", False) for e in events if e["event"] == "cycle"] == [
        True, True, False, False]


@pytest.mark.parametrize("xla_seconds, chosen", [(0.5, True), (2.0, False), (None, False)])
def test_auto_keeps_the_faster(tmp_path, monkeypatch, xla_seconds, chosen, own_cache):
    """The choice follows the timings both ways (None: XLA cannot compile the pass)."""
    def timed(trainer, xla):
        if xla and xla_seconds is None:
            raise tf.errors.InvalidArgumentError(None, None, "no XLA kernel")
        return xla_seconds if xla else 1.0
    monkeypatch.setattr(jit_choice_loop, "_seconds_per_call", timed)
    trainer = build(auto_config(**{"trainer.train_steps": 2}), tmp_path)
    trainer.train(evaluate=False)
    assert trainer.jit_compile is chosen
    assert json.load(open(tmp_path / "jit_compile.json"))["jit_compile"] is chosen


def test_synchronized_batch_norm_turns_auto_off_and_refuses_on(tmp_path):
    """Its all-reduce inside the forward pass cannot sit in a nested XLA function."""
    auto = build(zoo.zoo_config("synchronized_bn", **{"trainer.jit_compile": "auto"}),
                 tmp_path / "auto", two_replicas())
    assert auto.jit_compile is False
    with pytest.raises(ValueError, match=r"jit_compile=on, but batch_normalization "
                                         r"all-reduce.*jit_compile=off"):
        build(zoo.zoo_config("synchronized_bn", **{"trainer.jit_compile": "on"}),
              tmp_path / "on", two_replicas())
    one = build(zoo.zoo_config("synchronized_bn", **{"trainer.jit_compile": "on"}),
                tmp_path / "one")  # one replica: nothing to synchronize, XLA as asked
    assert one.jit_compile is True


def _config(config, jit):
    import copy
    c = copy.deepcopy(config)
    c.trainer.jit_compile = jit
    return c


@pytest.mark.parametrize("value,expected", [("on", True), ("off", False), ("True", True),
                                            ("FALSE", False), ("auto", "auto")])
def test_settings(value, expected):
    assert jit_choice.jit_setting(tiny_config(**{"trainer.jit_compile": value}).trainer,
                                  two_replicas()) == expected


def test_a_forced_setting_is_not_timed(tmp_path):
    trainer = build(tiny_config(**{"trainer.jit_compile": "off", "trainer.train_steps": 2}),
                    tmp_path)
    trainer.train(evaluate=False)
    assert trainer.jit_compile is False and not (tmp_path / "jit_compile.json").exists()


def test_a_bad_setting_is_a_clear_error():
    with pytest.raises(ValueError, match="trainer.jit_compile='fast' must be 'on', 'off'"):
        jit_choice.jit_setting(tiny_config(**{"trainer.jit_compile": "fast"}).trainer,
                               two_replicas())
