"""A stand-in for perftest's ``ib_write_bw`` on machines without RDMA (the testbed, CI).

It keeps what the sweep depends on: a server (no host argument) listens on ``-p PORT`` at
its node's address and exits when its client is done; a client (``... HOST``) connects to
HOST:PORT first (failing with perftest's "Couldn't connect to HOST:PORT" while nothing
listens) and then prints a recorded real client output
(tests/fixtures/perftest/ib_write_bw-ib-all-sizes-client.txt, source in SOURCES.md) with the
device and the bandwidth columns replaced. ``SLURMFABRIC_FAKEPERF`` maps ``node/device`` to
a fraction of the recorded bandwidth: the slower end of the rail wins. Installed on PATH as
``ib_write_bw`` by the tests.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path

RECORDED = Path(__file__).resolve().parent / "fixtures" / "perftest" / \
    "ib_write_bw-ib-all-sizes-client.txt"


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    opts, rest, i = {}, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-d", "-p", "-i", "-s", "-q"):
            opts[arg] = argv[i + 1]
            i += 2
            continue
        if arg.startswith("-"):
            opts[arg.split("=")[0]] = arg
        else:
            rest.append(arg)
        i += 1
    return opts, rest


def main(argv: list[str]) -> int:
    opts, hosts = _options(argv)
    port, device = int(opts.get("-p", "18515")), opts.get("-d", "mlx5_0")
    here = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if not hosts:  # the server
        with socket.create_server((socket.gethostbyname(here), port)) as server:
            server.settimeout(120)
            conn, _ = server.accept()
            with conn:
                peer = conn.recv(256).decode()
                conn.sendall(here.encode())
                conn.recv(1)  # the client closes when it is done
        return 0 if peer else 1
    host = hosts[0]
    try:
        conn = socket.create_connection((socket.gethostbyname(host), port), timeout=5)
    except OSError:
        print(f"Couldn't connect to {host}:{port}")
        print("Unable to open file descriptor for socket connection Unable to init the "
              "socket connection")
        return 1
    with conn:
        conn.sendall(here.encode())
        peer = conn.recv(256).decode()
    rates = json.loads(os.environ.get("SLURMFABRIC_FAKEPERF", "{}"))
    factor = min(float(rates.get(f"{n}/{device}", 1.0)) for n in (here, peer))
    print(client_output(device, factor), end="")
    return 0


def client_output(device: str, factor: float = 1.0) -> str:
    """The recorded client output for ``device``, its bandwidth scaled by ``factor``."""
    out = []
    for line in RECORDED.read_text().splitlines():
        line = line.replace("mlx5_0", device)
        row = re.match(r"^(\s*[0-9]+\s+[0-9]+\s+)([0-9.]+)(\s+)([0-9.]+)(.*)$", line)
        if row:
            line = (f"{row.group(1)}{float(row.group(2)) * factor:.2f}{row.group(3)}"
                    f"{float(row.group(4)) * factor:.2f}{row.group(5)}")
        if not line.startswith("[root@"):
            out.append(line)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
