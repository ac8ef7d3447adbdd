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
    """`config` is `config.distribution` (fields `strategy`, `tpu`)."""
    name = config.strategy
    if name not in STRATEGIES:
        raise ValueError(
            f"config.distribution.strategy={name!r} is unknown; choose one of {STRATEGIES}.")
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        if config.tpu:
            strategy = _connect_tpu(config.tpu)
        elif os.environ.get("TPU_NAME") or os.path.exists("/dev/accel0"):
            strategy = _connect_tpu(os.environ.get("TPU_NAME", "local"))
        else:
            if len(gpus) > 1:
                strategy = tf.distribute.MirroredStrategy()
            elif gpus:
                strategy = tf.distribute.OneDeviceStrategy(gpus[0].name)
            else:
                strategy = tf.distribute.get_strategy()
    elif name == "default":
        strategy = tf.distribute.get_strategy()
    elif name == "one_device":
        strategy = tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    elif name == "mirrored":
        strategy = tf.distribute.MirroredStrategy()
    elif name == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = _connect_tpu(config.tpu)
    logging.info("Strategy %s with %d replica(s).", type(strategy).__name__,
                 strategy.num_replicas_in_sync)
    return strategy
