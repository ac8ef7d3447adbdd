"""trainer.jit_compile: on, off, or auto (timed on the first launch, stored for the next)."""

import json

import pytest

from conftest import build, tiny_config, two_replicas
from trainer.runtime import settings as jit_choice


def test_auto_times_both_keeps_the_faster_and_a_relaunch_reuses_it(tmp_path, caplog):
    caplog.set_level("INFO")
    config = tiny_config(**{"trainer.jit_compile": "auto", "trainer.train_steps": 4,
                            "model.name": "resnet", "model.width": 4,
                            "model.blocks_per_stage": 1})
    trainer = build(config, tmp_path, two_replicas())
    assert trainer.jit_compile == "auto"
    trainer.train(evaluate=False)
    stored = json.load(open(tmp_path / "jit_compile.json"))
    seconds = stored["seconds_per_call"]
    assert seconds["no_xla"] > 0  # (xla: None where XLA cannot compile the pass, e.g.
    # MaxPool's gradient under the op determinism another test turned on in this process)
    assert stored["jit_compile"] == (seconds["xla"] is not None
                                     and seconds["xla"] < seconds["no_xla"])
    assert trainer.jit_compile is stored["jit_compile"]
    line = next(r.getMessage() for r in caplog.records
                if "jit_compile=auto: the forward" in r.getMessage())
    assert "with XLA" in line and "without" in line
    # The timing left no trace: 4 steps from the same start as a run told the choice.
    told = build(_config(config, "on" if stored["jit_compile"] else "off"),
                 tmp_path / "told", two_replicas())
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
