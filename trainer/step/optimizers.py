"""Keras optimizers and learning-rate schedules from `config.optimizer`."""

import keras
from absl import logging

from trainer.runtime.settings import check_number
from trainer.state.layout import matching
from trainer.step.ema import check_ema_decay

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine")


def build_learning_rate(config, train_steps, step=None):
    """Constant, or linear warmup to `learning_rate` then cosine decay to 0 at `train_steps`.

    With `step` (the Trainer's step variable) the rate is a zero-argument
    callable of it. The Trainer's `step` counts every step, skipped ones
    included, like `train_steps`, logs and checkpoints; Keras' default,
    `optimizer.iterations` (used when `step` is None), counts applied updates
    only and lags behind after skipped steps (Adam's bias correction still
    uses it, as it should). Being a callable, the rate is not an optimizer
    variable: a checkpoint never carries an old rate into a run with another
    config.
    """
    if config.schedule not in SCHEDULES:
        raise ValueError(f"config.optimizer.schedule={config.schedule!r} is unknown; "
                         f"choose one of {SCHEDULES}.")
    check_number(config.learning_rate, "optimizer.learning_rate", "the schedule's peak rate")
    if config.schedule == "constant":
        rate = float(config.learning_rate)
        return rate if step is None else lambda: rate
    warmup = int(config.warmup_steps)
    if not 0 <= warmup < train_steps:
        raise ValueError(f"optimizer.warmup_steps={warmup} must be in [0, trainer.train_steps="
                         f"{train_steps}): for a run this short, set "
                         f"--config.optimizer.warmup_steps={train_steps // 10} (a tenth of "
                         "it), or train longer.")
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else config.learning_rate,
        decay_steps=train_steps - warmup,
        warmup_target=config.learning_rate if warmup else None,
        warmup_steps=warmup)
    return schedule if step is None else lambda: schedule(step)


def trained_variables(names, config):
    """{name: variable} that the optimizer updates: the float trainable variables of
    `names` ({name: variable}, trainer/state/layout.py) but those `config.freeze` matches."""
    trainable = {n: v for n, v in names.items()
                 if v.trainable and keras.backend.is_float_dtype(v.dtype)}
    frozen = set(matching(trainable, config.freeze,
                          "optimizer.freeze (over trainable variables)"))
    if frozen:
        logging.info("optimizer.freeze: %d variables get no updates: %s", len(frozen),
                     ", ".join(sorted(frozen)))
    return {n: v for n, v in trainable.items() if n not in frozen}


def build_optimizer(config, train_steps, step=None, trained=None):
    """`config` is `config.optimizer`; `step` drives the learning rate (see above);
    with `trained` ({name: variable}, see `trained_variables`) the optimizer is built
    for those variables, so its slots exist before a restore.

    Clipping is not set here: the Trainer clips by the global norm of the
    reduced gradients (Keras' clipnorm would clip each replica's local
    gradients). `ema_decay` > 0 turns on Keras' EMA of the weights. AdamW
    does not decay the variables `weight_decay_exclude` matches."""
    check_number(config.clip_norm, "optimizer.clip_norm", "0: no clipping")
    optimizer = _keras_optimizer(config, build_learning_rate(config, train_steps, step))
    if trained is not None:
        if config.name == "adamw":
            # Generic defaults: a pattern that matches nothing here is no error.
            excluded = matching(trained, config.weight_decay_exclude,
                                "optimizer.weight_decay_exclude", required=False)
            logging.info("AdamW decays %d variables, not these %d (optimizer."
                         "weight_decay_exclude): %s", len(trained) - len(excluded),
                         len(excluded), ", ".join(excluded))
            optimizer.exclude_from_weight_decay(var_list=[trained[n] for n in excluded])
        optimizer.build(list(trained.values()))
    return optimizer


def _keras_optimizer(config, lr):
    ema_decay = check_ema_decay(config.ema_decay)
    ema = dict(use_ema=True, ema_momentum=ema_decay) if ema_decay else {}  # see trainer/step/ema.py
    if config.name == "adam":
        return keras.optimizers.Adam(lr, **ema)
    if config.name == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=config.weight_decay, **ema)
    if config.name == "sgd":
        return keras.optimizers.SGD(lr, momentum=config.momentum, nesterov=config.nesterov,
                                    **ema)
    raise ValueError(f"config.optimizer.name={config.name!r} is unknown; "
                     f"choose one of {OPTIMIZERS}.")
