"""``slurmfabric testbed up|down|status|env``: the local multi-node Slurm cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from slurmfabric.testbed import Settings, Testbed, default_state_dir


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurmfabric testbed",
        description="A real Slurm cluster on this machine: munged, slurmctld and one slurmd "
        "per virtual node on its own loopback address. Needs root for apt and /etc/hosts.",
    )
    p.add_argument("action", choices=["up", "down", "status", "env"])
    p.add_argument("--state-dir", type=Path, default=None,
                   help=f"where config, keys, logs and PIDs live (default {default_state_dir()}"
                   ", or $SLURMFABRIC_TESTBED_DIR)")
    d = Settings()
    p.add_argument("-n", "--nodes", type=int, default=d.nodes, help="virtual nodes (up)")
    p.add_argument("--prefix", default=d.prefix, help="node name prefix (up)")
    p.add_argument("--cpus", type=int, default=d.cpus, help="CPUs declared per node (up)")
    p.add_argument("--ctld-port", type=int, default=d.ctld_port, help="SlurmctldPort (up)")
    p.add_argument("--node-port-base", type=int, default=d.node_port_base,
                   help="first slurmd port; node i uses base+i (up)")
    p.add_argument("--addr-prefix", default=d.addr_prefix,
                   help="node i gets address PREFIX<i+1> (up)")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for idle nodes")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    state_dir = args.state_dir or default_state_dir()
    if args.action == "up":
        settings = Settings(
            state_dir=state_dir, nodes=args.nodes, prefix=args.prefix, cpus=args.cpus,
            ctld_port=args.ctld_port, node_port_base=args.node_port_base,
            addr_prefix=args.addr_prefix,
        )
        running = Testbed.from_state(state_dir)
        if running.running():
            settings = running.s  # reattach: never reconfigure a live cluster silently
        Testbed(settings).up(timeout=args.timeout)
        return 0
    testbed = Testbed.from_state(state_dir)
    if args.action == "down":
        testbed.down()
    elif args.action == "status":
        print(testbed.status())
        return 0 if testbed.running() else 3
    else:
        print(testbed.export_lines(), end="")
    return 0
