"""What the wall-time benchmarks (startup, time_to_accuracy) share: `model.fit`'s set-up
of a config, and the user cache a Trainer run starts from."""

import os
import shutil


def fit_setup(config, steps_per_execution, mark=lambda phase: None):
    """(task, model, train and eval datasets) for `model.fit`: the Trainer's task, model,
    optimizer (its clipping too), precision and seed, the task's metrics, compiled with
    `steps_per_execution`. `mark(phase)` is called as "strategy", "data" and "build"
    end."""
    import keras
    import tensorflow as tf
    from trainer.task import get_task
    from trainer.runtime.distribute import build_strategy
    from trainer.runtime.precision import set_policy
    from trainer.step.optimizers import build_optimizer
    strategy = build_strategy(config.distribution)
    set_policy(config.precision, strategy)
    keras.utils.set_random_seed(config.seed)
    mark("strategy")
    task = get_task(config)
    context = tf.distribute.InputContext()
    train = task.build_inputs("train", context, 0)
    evaluation = task.build_inputs("eval", context, 0)
    mark("data")
    with strategy.scope():
        model = task.build_model()
        optimizer = build_optimizer(config.optimizer, config.trainer.train_steps)
        if config.optimizer.clip_norm:  # one replica: the Trainer's clipping, the same
            optimizer.global_clipnorm = config.optimizer.clip_norm
        # The task's metrics, as the Trainer computes them (a Sum counter takes one
        # value, not (labels, outputs): it stays out).
        metrics = [m for m in task.build_metrics() if not isinstance(m, keras.metrics.Sum)]
        model.compile(optimizer=optimizer, loss=task.compute_loss, metrics=metrics,
                      steps_per_execution=steps_per_execution)
    mark("build")
    return task, model, train, evaluation


def fresh_cache(base):
    """A user cache as on a machine that has run other models, not this one: the CPU's
    peak (a per-machine figure) copied from the user's cache if it holds one."""
    cache = os.path.join(base, "cache")
    os.makedirs(os.path.join(cache, "tftrainer"), exist_ok=True)
    peak = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                        "tftrainer", "cpu_peak.json")
    if os.path.exists(peak):
        shutil.copy(peak, os.path.join(cache, "tftrainer"))
    return cache
