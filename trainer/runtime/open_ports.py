"""The listening ports a run opens, said where they open.

TensorFlow's gRPC servers (a MultiWorkerMirrored worker's, the tf.data service's
dispatcher and workers) listen on every network interface, whatever host the
cluster spec names, offer no option to bind loopback only, and run whatever graph
a client sends them, unauthenticated (TensorFlow's SECURITY.md). So every mode that
starts one says which ports, and what anyone who reaches them can do.
"""

from absl import logging

EXPOSURE = ("on every network interface (TensorFlow binds its gRPC servers to all of them), "
            "with no authentication: anyone who can reach this machine on {which} can run "
            "any TensorFlow graph in this process, reading and writing files as this user. "
            "Keep them behind a firewall or on a private network (README, 'Security').")


def port_of(address):
    """The port of "host:port" or "grpc://host:port"."""
    return int(address.rsplit(":", 1)[1])


def open_ports_message(what, ports):
    """That `what` listens on `ports` (ints), and what that exposes."""
    ports = sorted(ports)
    one = len(ports) == 1
    return (f"{what} listen{'s' if one else ''} on port{'' if one else 's'} "
            f"{', '.join(map(str, ports))} "
            + EXPOSURE.format(which="that port" if one else "those ports"))


def warn_open_ports(what, ports):
    logging.warning("%s", open_ports_message(what, ports))
