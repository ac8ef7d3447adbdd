"""Train input through the tf.data service, when decoding on the trainer's cores is the
bottleneck: `data.service` = "local" (an in-process dispatcher and workers on
localhost, for tests and spare cores) or "grpc://host:port" (a running dispatcher whose
workers run on other machines; BUILD.md, "Input pipelines", shows how to start them).

Dynamic sharding hands each replica batch of the step-indexed stream to one worker:
every batch is read once, so every example once per epoch, but in the order the
workers deliver them. That order is not a function of the step, so a resume is no
longer exact: batches in flight at a stop may be read again or not at all.
"""

import functools

import tensorflow as tf
from absl import logging

GUARANTEE = ("data.service=%s: train batches come from tf.data service workers, each "
             "replica batch of the stream once (dynamic sharding), so each example once per "
             "epoch, in the order the workers deliver them; a resume is no longer exact "
             "(batches in flight at a stop may be read again or skipped).")


_LOCAL_SERVERS = []  # the in-process dispatcher and workers live as long as the process


@functools.lru_cache(maxsize=None)
def local_service(workers):
    """Starts a dispatcher and `workers` workers in this process (kept for its life);
    returns the dispatcher's address."""
    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    servers = [tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
        for _ in range(workers)]
    logging.info("tf.data service: a dispatcher at %s and %d worker(s) in this process.",
                 dispatcher.target, workers)
    _LOCAL_SERVERS.append((dispatcher, servers))
    return dispatcher.target


def address(data):
    """The dispatcher's grpc:// address per data.service and data.service_workers."""
    if data.service == "local":
        if data.service_workers < 1:
            raise ValueError(f"data.service_workers={data.service_workers} must be >= 1.")
        return local_service(data.service_workers)
    if not data.service.startswith("grpc://"):
        raise ValueError(f"data.service={data.service!r} must be '', 'local' or "
                         "'grpc://host:port' (a running dispatcher).")
    return data.service


def distribute(dataset, data):
    """`dataset` read through the service named by `data.service`."""
    target = address(data)
    logging.log_first_n(logging.WARNING, GUARANTEE, 1, data.service)
    return dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
        service=target))
