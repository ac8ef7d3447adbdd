"""Builds the tf.distribute strategy named by `config.distribution.strategy`."""

import os

import tensorflow as tf
from absl import logging

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")


def _connect_tpu(address):
    """Resolves, connects to and initializes a TPU; raises one clear error if absent."""
    tried = address or "(local TPU VM / TPU_NAME)"
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as e:  # The resolver raises ValueError, URLError, OpError...
        reason = str(e).strip().splitlines()[0][:200]
        raise RuntimeError(
            f"No TPU found at {tried}: {reason}. Set --config.distribution.tpu to the TPU "
            "name or grpc:// address, or choose another "
            "--config.distribution.strategy (auto, default, mirrored).") from e
    return tf.distribute.TPUStrategy(resolver)


def build_strategy(config):
    """`config` is `config.distribution` (fields `strategy`, `tpu`, ...)."""
    if config.strategy not in STRATEGIES:
        raise ValueError(f"config.distribution.strategy={config.strategy!r} is unknown; "
                         f"choose one of {STRATEGIES}.")
    strategy = _make_strategy(config)
    logging.info("Strategy %s with %d replica(s).", type(strategy).__name__,
                 strategy.num_replicas_in_sync)
    return strategy


def _make_strategy(config):
    name = config.strategy
    if name == "multi_worker":
        # Made before anything initializes the TF runtime (collectives need that).
        # A bounded wait on every collective: a dead peer becomes an error, not a hang.
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=config.collective_timeout_seconds or None)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    local_tpu = os.environ.get("TPU_NAME") or os.path.exists("/dev/accel0")
    if name == "tpu" or (name == "auto" and (config.tpu or local_tpu)):
        return _connect_tpu(config.tpu or os.environ.get("TPU_NAME", "local" if local_tpu else ""))
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if len(gpus) > 1:  # auto
        return tf.distribute.MirroredStrategy()
    if gpus:
        return tf.distribute.OneDeviceStrategy(gpus[0].name)
    return tf.distribute.get_strategy()


def is_chief(strategy):
    """Whether this process writes the workdir: the lock, config.json, checkpoints, summaries.

    Decided by task identity, the same way for every strategy: the `chief` task if
    the cluster has one, else worker 0; a single-client strategy (default,
    Mirrored, TPU: one Python process drives every host of a TPU pod) has no
    task type and is its own chief. Not `strategy.extended.should_checkpoint`,
    which TPUStrategy sets on every process alike.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type:
        return True
    if "chief" in resolver.cluster_spec().jobs:
        return task_type == "chief"
    return task_type == "worker" and (resolver.task_id or 0) == 0
