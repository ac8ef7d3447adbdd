"""EMA weights: Keras' optimizer EMA (`use_ema`), swapped into the model to evaluate.

The average is Keras' own: float32 optimizer variables (so checkpointed with
the optimizer), updated inside `optimizer.apply`, i.e. on applied steps only
(a skipped step applies nothing), with the same reduced gradients on every
replica. `average = decay * average + (1 - decay) * weights` after each
applied update; Keras sets the average to the weights at the first one (and
before it, the average is the initial weights).
"""

import contextlib

import tensorflow as tf

from trainer.runtime.keras_internals import EMA_AVERAGES, ema_averages



def check_ema_decay(decay):
    if not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0 <= decay < 1:
        raise ValueError(f"optimizer.ema_decay={decay!r} must be a number in [0, 1) "
                         "(0: no EMA; 0.999 averages over about the last 1000 steps).")
    return float(decay)


def evaluates_ema(config):
    """Whether evaluation, the best checkpoint and export use the EMA weights."""
    return bool(config.optimizer.ema_decay) and config.eval.use_ema


class EmaWeights:
    """Swaps the EMA of the trainable weights with the weights themselves, and back.

    A swap is exact (values are moved, not recomputed), so training resumes on
    bitwise the raw weights; it happens between steps, never inside a save.
    """

    def __init__(self, variables, optimizer):
        """`variables`: the trained ones, as the optimizer was built for."""
        averages = ema_averages(optimizer)
        if averages is None or len(averages) != len(variables):
            raise RuntimeError(
                f"{type(optimizer).__name__} (Keras {__import__('keras').__version__}) holds "
                f"no {EMA_AVERAGES} for the model's {len(variables)} trained "
                "variables: this Keras changed where it keeps the EMA. Install the Keras "
                "version pinned in pyproject.toml, or set --config.optimizer.ema_decay=0.")
        self.variables, self.averages = list(variables), averages
        self.start_from_weights()
        self._swap = tf.function(self._swap_values)

    def start_from_weights(self):
        """Keras creates the averages as zeros and sets them at the first applied update:
        until then (a restore overwrites this) the average is the weights, not zeros."""
        for variable, average in zip(self.variables, self.averages):
            average.assign(variable)

    def _swap_values(self):
        for variable, average in zip(self.variables, self.averages):
            weights = tf.identity(variable.value)
            variable.assign(average.value)
            average.assign(weights)

    @contextlib.contextmanager
    def swapped_in(self):
        """The model holds the EMA weights inside the block, its own weights after."""
        self._swap()
        try:
            yield
        finally:
            self._swap()
