"""Keras optimizers and learning-rate schedules from `config.optimizer`."""

import keras

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine")


def build_learning_rate(config, train_steps):
    """Constant, or linear warmup to `learning_rate` then cosine decay to 0."""
    if config.schedule not in SCHEDULES:
        raise ValueError(f"config.optimizer.schedule={config.schedule!r} is unknown; "
                         f"choose one of {SCHEDULES}.")
    if config.schedule == "constant":
        return config.learning_rate
    warmup = int(config.warmup_steps)
    if not 0 <= warmup < train_steps:
        raise ValueError(f"config.optimizer.warmup_steps={warmup} must be in "
                         f"[0, trainer.train_steps={train_steps}).")
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else config.learning_rate,
        decay_steps=train_steps - warmup,
        warmup_target=config.learning_rate if warmup else None,
        warmup_steps=warmup)


def build_optimizer(config, train_steps):
    """`config` is `config.optimizer`. Clipping is not set here: the Trainer
    clips by the global norm of the reduced gradients (Keras' clipnorm would
    clip each replica's local gradients)."""
    lr = build_learning_rate(config, train_steps)
    if config.name == "adam":
        return keras.optimizers.Adam(lr)
    if config.name == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=config.weight_decay)
    if config.name == "sgd":
        return keras.optimizers.SGD(lr, momentum=config.momentum, nesterov=config.nesterov)
    raise ValueError(f"config.optimizer.name={config.name!r} is unknown; "
                     f"choose one of {OPTIMIZERS}.")
