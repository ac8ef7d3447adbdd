"""Every listening port a run opens is told, with what anyone who reaches it can do."""

import os
import re

from support import ROOT
from trainer.data import service as data_service


def listening_on_every_interface():
    """The TCP ports this machine listens on at 0.0.0.0 or [::] (from /proc/net)."""
    ports = set()
    for table, wildcard in (("tcp", "00000000"), ("tcp6", "0" * 32)):
        with open(f"/proc/net/{table}") as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port = local.split(":")
                if state == "0A" and address == wildcard:  # LISTEN
                    ports.add(int(port, 16))
    return ports


def test_the_local_data_service_names_the_ports_it_opens(caplog):
    caplog.set_level("WARNING")
    data_service.local_service(3)  # (a count no other test starts: this one's servers)
    (message,) = [r.getMessage() for r in caplog.records if "data.service=local" in
                  r.getMessage()]
    ports = [int(p) for p in re.search(r"listen on ports ([\d, ]+) on every", message)
             .group(1).split(", ")]
    assert len(ports) == 4  # the dispatcher and 3 workers
    assert set(ports) <= listening_on_every_interface()  # what it says is true
    assert "can run any TensorFlow graph in this process" in message
    assert "README, 'Security'" in message


def test_help_says_local_workers_open_ports():
    from trainer import cli  # (defines the flags --help prints)
    assert re.search(r"listens on every network interface, unauthenticated, and runs any "
                     r"graph", cli.FLAGS["local_workers"].help)


def test_the_readme_tells_each_mode_s_ports():
    readme = open(os.path.join(ROOT, "README.md")).read()
    security = readme.split("## Security", 1)[1].split("\n## ", 1)[0]
    for mode in ("--local_workers=N", "multi_worker", "data.service=local",
                 "python -m trainer.data.service", "NetworkPolicy"):
        assert mode in security
