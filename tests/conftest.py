"""The suite's fixtures and hooks. The helpers the tests share are in support/ (`from
support import ...`); importing it first sets the process up (two logical CPU devices, a
user cache of the suite's own), before any test module builds a strategy."""

import support  # noqa: F401  (first: sets the process up)

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")
