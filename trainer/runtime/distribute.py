"""Builds the tf.distribute strategy named by `config.distribution.strategy`."""

import os
import re
import shutil

import tensorflow as tf
from absl import logging

from trainer.runtime.open_ports import open_ports_message, port_of, warn_open_ports
from trainer.runtime.settings import check_number

STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")
CLUSTERS = ("tf_config", "slurm")
ALL_REDUCE = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
              "ring": tf.distribute.experimental.CommunicationImplementation.RING,
              "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}
ALL_REDUCE_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16}


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
    if address and address != "local":  # a TPU over the network: TF serves its client
        logging.warning("%s", open_ports_message(
            "Connecting to the TPU at a remote address started TensorFlow's gRPC server of "
            "this client, which", ["(one TensorFlow picks)"]))
    return tf.distribute.TPUStrategy(resolver)


def build_strategy(config):
    """`config` is `config.distribution` (fields `strategy`, `tpu`, ...)."""
    if config.strategy not in STRATEGIES:
        raise ValueError(f"config.distribution.strategy={config.strategy!r} is unknown; "
                         f"choose one of {STRATEGIES}.")
    for field, known in (("all_reduce", ALL_REDUCE), ("all_reduce_dtype", ALL_REDUCE_DTYPES)):
        if config[field] not in known:
            raise ValueError(f"config.distribution.{field}={config[field]!r} is unknown; "
                             f"choose one of {tuple(known)}.")
    check_number(config.collective_timeout_seconds, "distribution.collective_timeout_seconds",
                 "seconds a worker waits on a silent peer before failing; without a bound "
                 "a lost worker would hang the job forever", positive=True)
    if config.cluster not in CLUSTERS:
        raise ValueError(f"config.distribution.cluster={config.cluster!r} is unknown; "
                         f"choose one of {CLUSTERS}.")
    if config.cluster == "slurm" and config.strategy not in ("auto", "multi_worker"):
        raise ValueError("config.distribution.cluster=slurm runs MultiWorkerMirrored: set "
                         "config.distribution.strategy=multi_worker (or auto).")
    strategy = _make_strategy(config)
    logging.info("Strategy %s with %d replica(s).", type(strategy).__name__,
                 strategy.num_replicas_in_sync)
    _log_cluster(strategy, config.cluster)
    return strategy


def _log_cluster(strategy, source):
    """The cluster a multi-worker strategy resolved: its workers, this task, replicas."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if not getattr(resolver, "task_type", None) or isinstance(
            resolver, tf.distribute.cluster_resolver.TPUClusterResolver):
        return
    workers = resolver.cluster_spec().as_dict().get("worker", [])
    logging.info("Cluster from %s: %d worker(s) (%s); this process is %s %d; %d replica(s) "
                 "per worker.", source, len(workers), ", ".join(workers), resolver.task_type,
                 resolver.task_id, strategy.num_replicas_in_sync // max(len(workers), 1))
    own = resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id)
    warn_open_ports(f"This {resolver.task_type}'s MultiWorkerMirrored gRPC server",
                    [port_of(own)])


def _make_strategy(config):
    name = config.strategy
    if name == "multi_worker" or config.cluster == "slurm":
        # Made before anything initializes the TF runtime (collectives need that).
        # A bounded wait on every collective: a dead peer becomes an error, not a hang.
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=config.collective_timeout_seconds,
            implementation=ALL_REDUCE[config.all_reduce],
            bytes_per_pack=config.bytes_per_pack)
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=_slurm_resolver(config) if config.cluster == "slurm" else None,
            communication_options=options)
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


def _slurm_resolver(config):
    """The cluster of the `srun` step this process is a task of. The resolver counts GPUs
    with nvidia-smi and cannot be told 0 (it steps through them): on a node without
    GPUs it gets one nominal GPU per task and sets no CUDA_VISIBLE_DEVICES."""
    if "SLURM_PROCID" not in os.environ:
        raise RuntimeError("config.distribution.cluster=slurm, but SLURM_PROCID is not set: "
                           "start each worker with srun (examples/slurm.sbatch).")
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver
    if os.environ.get("CUDA_VISIBLE_DEVICES") or shutil.which("nvidia-smi"):
        return resolver(port_base=config.port_base)
    # srun's "2(x3),1": 2 tasks on each of 3 nodes, then 1
    tasks_per_node = max(int(n) for n, _ in re.findall(
        r"(\d+)(\(x\d+\))?", os.environ.get("SLURM_STEP_TASKS_PER_NODE", "1")))
    return resolver(port_base=config.port_base, gpus_per_node=tasks_per_node,
                    gpus_per_task=1, auto_set_gpu=False)


def sum_over_replicas(replica, grads, loss, dtype="float32"):
    """(gradients, loss) summed over replicas, in one all-reduce, the gradients sent as
    `dtype` (config.distribution.all_reduce_dtype: bfloat16 halves the bytes; its
    exponent range is float32's, so a loss-scaled overflow still arrives as inf) and
    returned as float32, for a float32 update."""
    if dtype == "float32":
        *summed, loss = replica.all_reduce(tf.distribute.ReduceOp.SUM, grads + [loss])
        return summed, loss
    # (one all-reduce packs its tensors together, so they must share a dtype)
    summed = replica.all_reduce(tf.distribute.ReduceOp.SUM,
                                [tf.cast(g, ALL_REDUCE_DTYPES[dtype]) for g in grads])
    loss = replica.all_reduce(tf.distribute.ReduceOp.SUM, loss)
    return [tf.cast(g, tf.float32) for g in summed], loss


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


def worker_index(strategy):
    """This process's task index in its cluster (0 for a single-client strategy): what
    names a worker's own files."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return (resolver.task_id or 0) if getattr(resolver, "task_type", None) else 0
