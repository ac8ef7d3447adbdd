"""Reading `config.trainer`: the loop's intervals and the on / off / auto switches,
checked once, with errors that name the fix."""

import tensorflow as tf
from absl import logging

from trainer.runtime.debug import check_debug

_ON_OFF_AUTO = {"on": True, "true": True, "off": False, "false": False, "auto": "auto"}


def on_off_auto(trainer_config, field):
    """True, False or "auto" from `trainer.<field>` (on / true, off / false, auto)."""
    value = trainer_config[field]
    if str(value).lower() not in _ON_OFF_AUTO:
        raise ValueError(f"trainer.{field}={value!r} must be 'on', 'off' or 'auto'.")
    return _ON_OFF_AUTO[str(value).lower()]


def jit_setting(trainer_config, strategy, synchronizing=()):
    """True, False or "auto" from `trainer.jit_compile` (on / off / auto).

    `synchronizing`: the paths of layers that all-reduce inside the forward pass
    (synchronized BatchNormalization). Their all-reduce is a synchronization point,
    which a nested XLA function cannot hold off a TPU: "auto" is then off, "on" an
    error. A TPU compiles the whole replicated step, all-reduces included.
    """
    setting = on_off_auto(trainer_config, "jit_compile")
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return True  # a TPU runs compiled programs only
    if trainer_config.debug:  # eager runs no XLA; a dump sees the ops XLA would fuse away
        return False
    if synchronizing and setting is True:
        raise ValueError(
            f"trainer.jit_compile=on, but {', '.join(synchronizing[:3])} all-reduce(s) "
            "batch statistics across replicas inside the forward pass, which an XLA-compiled "
            "pass cannot hold on CPUs and GPUs. Set --config.trainer.jit_compile=off (or "
            "auto), or use BatchNormalization(synchronized=False).")
    if synchronizing and setting == "auto":
        logging.info("jit_compile=auto is off: %s synchronize across replicas inside the "
                     "forward pass, which XLA cannot compile here.",
                     ", ".join(synchronizing[:3]))
        return False
    return setting


def synchronizing_layers(layers):
    """The paths of `layers` that all-reduce in their forward pass (Keras'
    BatchNormalization(synchronized=True))."""
    return [layer.path for layer in layers if getattr(layer, "synchronized", False) is True]


def check_number(value, field, meaning, positive=False):
    """Fails unless `value` (config field `field`) is a number >= 0, or > 0 with
    `positive`; `meaning` says what it sets, in the error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            value > 0 if positive else value >= 0):
        raise ValueError(f"{field}={value!r} must be a number {'>' if positive else '>='} 0 "
                         f"({meaning}); set --config.{field}.")


def check_trainer_config(tc):
    """Fails on `config.trainer` values the loop cannot honour, naming the fix."""
    for name in ("train_steps", "steps_per_loop", "log_every", "checkpoint_every",
                 "eval_every", "early_stop_patience", "consistency_every",
                 "max_nonfinite_steps"):
        value, minimum = tc[name], 1 if name in ("train_steps", "steps_per_loop") else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(
                f"trainer.{name}={value!r} must be an integer >= {minimum}"
                + (" (0: off)." if name == "consistency_every" else
                   " (0: only at the end of training)." if name.endswith("_every") else
                   " (0: 100 with float16 loss scaling, else 1)."
                   if name == "max_nonfinite_steps" else "."))
    check_number(tc.max_seconds, "trainer.max_seconds", "0: no time budget")
    check_debug(tc)
    check_number(tc.diagnose_max_seconds, "trainer.diagnose_max_seconds",
                 "the longest the replay of a diverged run may take", positive=True)
    if tc.best_mode not in ("max", "min"):
        raise ValueError(f"trainer.best_mode={tc.best_mode!r} must be 'max' or 'min'.")
    if tc.early_stop_patience and not tc.best_metric:
        raise ValueError("trainer.early_stop_patience needs trainer.best_metric, the eval "
                         "metric to watch (e.g. --config.trainer.best_metric=eval/loss "
                         "--config.trainer.best_mode=min).")
