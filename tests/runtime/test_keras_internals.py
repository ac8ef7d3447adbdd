"""The private Keras APIs are reached through one module that checks the Keras version."""

import keras
import pytest

from trainer.runtime import keras_internals


@pytest.mark.parametrize("call, api", [
    (lambda: keras_internals.sublayers(keras.Sequential([keras.layers.Dense(1)])),
     "Layer._flatten_layers"),
    (lambda: keras_internals.ema_averages(keras.optimizers.Adam(use_ema=True)),
     "Optimizer._model_variables_moving_average"),
    (lambda: keras_internals.apply_gradients_as_given(keras.optimizers.Adam()),
     "Optimizer._all_reduce_sum_gradients"),
    (lambda: keras_internals.fresh_name_counters().__enter__(),
     "keras.src.backend.common.global_state object_name_uids"),
])
def test_an_untested_keras_version_fails_naming_the_private_api(monkeypatch, call, api):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    with pytest.raises(RuntimeError, match=rf"Keras 3\.99\.0 .*{api}"):
        call()


class _Pair(keras.layers.Layer):
    def __init__(self, inner=None):
        super().__init__()
        self.first = inner or keras.layers.Dense(2)
        self.second = keras.layers.Dense(3)


def test_sublayers_are_every_nested_layer_each_after_its_parent():
    outer = _Pair(inner=_Pair())
    inner = outer.first
    found = keras_internals.sublayers(outer)
    assert sorted(map(id, found)) == sorted(map(id, [inner, inner.first, inner.second,
                                                     outer.second]))
    assert found.index(inner) < min(found.index(inner.first), found.index(inner.second))
    assert keras_internals.sublayers(outer, recursive=False) == [inner, outer.second]


def test_fresh_name_counters_name_as_a_fresh_process_and_never_repeat_after():
    keras.layers.Dense(1)  # counters in use
    with keras_internals.fresh_name_counters():
        assert keras.layers.Dense(1).name == "dense"
        assert keras.layers.Dense(1).name == "dense_1"
    after = {keras.layers.Dense(1).name for _ in range(3)}
    assert not after & {"dense", "dense_1"}
