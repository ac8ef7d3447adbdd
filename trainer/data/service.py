"""Train input through the tf.data service, when decoding on the trainer's cores is the
bottleneck: `data.service` = "local" (a dispatcher and workers inside the training
process, sharing its cores: for tests; its gRPC ports still listen on every interface)
or "grpc://host:port" (a running dispatcher whose
workers run on other machines; docs/data.md#the-tfdata-service shows how to start them).

Dynamic sharding hands each replica batch of the step-indexed stream to one worker:
every batch is read at most once (a worker that dies loses those it held), so every
example at most once per epoch, in the order the workers deliver them. That order is
not a function of the step, so a resume is no longer exact: batches in flight at a stop
may be read again or not at all.

On the machines that serve a run (each with this package installed and the data at the
same paths):
    python -m trainer.data.service --dispatcher --port=5050              # one machine
    python -m trainer.data.service --dispatcher_address=HOST:5050 --port=5051  # each worker
"""

import tensorflow as tf
from absl import logging

from trainer.runtime.open_ports import port_of, warn_open_ports

GUARANTEE = ("data.service=%s: train batches come from tf.data service workers, each "
             "replica batch of the stream at most once (dynamic sharding), so each example "
             "at most once per epoch, in the order the workers deliver them; a resume is no "
             "longer exact (batches in flight at a stop may be read again or skipped).")


_LOCAL = {}  # workers -> (dispatcher, workers), alive as long as the process


def local_service(workers):
    """The address of a dispatcher with `workers` workers in this process, started at
    the first call."""
    if workers in _LOCAL:
        return _LOCAL[workers][0].target
    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    servers = [tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
        for _ in range(workers)]
    logging.info("tf.data service: a dispatcher at %s and %d worker(s) in this process.",
                 dispatcher.target, workers)
    warn_open_ports("data.service=local: the tf.data service dispatcher and workers of "
                    "this process", [port_of(dispatcher.target)]
                    + [port_of(s._address) for s in servers])  # (TF's own attribute)
    _LOCAL[workers] = (dispatcher, servers)
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


def serve(argv):
    """Runs a dispatcher (--dispatcher) or a worker of one until killed."""
    del argv
    from absl import flags
    f = flags.FLAGS
    service = tf.data.experimental.service
    if f.dispatcher:
        server = service.DispatchServer(service.DispatcherConfig(port=f.port))
    else:
        if not f.dispatcher_address:
            raise SystemExit("Give --dispatcher (this machine dispatches) or "
                             "--dispatcher_address=HOST:PORT (this machine is a worker).")
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=f.dispatcher_address, port=f.port,
            worker_address=f"{f.worker_host}:{f.port}" if f.worker_host else None))
    logging.info("tf.data service %s serving on port %d.",
                 "dispatcher" if f.dispatcher else "worker", f.port)
    warn_open_ports(f"This tf.data service {'dispatcher' if f.dispatcher else 'worker'}",
                    [f.port])
    server.join()


if __name__ == "__main__":
    from absl import app, flags
    flags.DEFINE_bool("dispatcher", False, "Run the dispatcher (else a worker).")
    flags.DEFINE_string("dispatcher_address", "", "A worker's dispatcher, HOST:PORT.")
    flags.DEFINE_integer("port", 5050, "The port to serve on.")
    flags.DEFINE_string("worker_host", "", "The host name trainers reach this worker by "
                        "('': localhost, for a worker on the trainer's machine).")
    app.run(serve)
