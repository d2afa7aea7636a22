"""``slurmfabric testbed up|down|status|env``: the local multi-node Slurm cluster."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from slurmfabric.commands._args import number
from slurmfabric.testbed import Settings, Testbed, default_state_dir

UP_OPTIONS = ("nodes", "prefix", "cpus", "ctld_port", "node_port_base", "addr_prefix",
              "accounting")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurmfabric testbed",
        description="A real Slurm cluster on this machine: munged, slurmctld and one slurmd "
        "per virtual node on its own loopback address. Needs root for apt and /etc/hosts.",
    )
    p.add_argument("action", choices=["up", "down", "status", "env"])
    p.add_argument("--state-dir", type=Path, default=None,
                   help=f"where config, keys, logs and PIDs live (default {default_state_dir()}"
                   ", or $SLURMFABRIC_TESTBED_DIR)")
    # Defaults are None: an option not given keeps the state dir's saved settings, so
    # `up --state-dir X` restarts X's cluster as it was, not on the default ports.
    d = Settings()
    p.add_argument("-n", "--nodes", type=number(1, 64, integer=True),
                   help=f"virtual nodes (up; default {d.nodes})")
    p.add_argument("--prefix", help=f"node name prefix (up; default {d.prefix})")
    p.add_argument("--cpus", type=number(1, 4096, integer=True),
                   help=f"CPUs declared per node (up; default {d.cpus})")
    p.add_argument("--ctld-port", type=number(1024, 65535, integer=True),
                   help=f"SlurmctldPort (up; default {d.ctld_port})")
    p.add_argument("--node-port-base", type=number(1024, 65535, integer=True),
                   help=f"first slurmd port; node i uses base+i (up; default {d.node_port_base})")
    p.add_argument("--addr-prefix",
                   help=f"node i gets address PREFIX<i+1> (up; default {d.addr_prefix})")
    p.add_argument("--accounting", action="store_const", const=True, default=None,
                   help="also run slurmdbd on a private MariaDB, so sacct works (up; needs "
                   "the slurmdbd and mariadb-server packages)")
    p.add_argument("--timeout", type=number(0, 3600, low_open=True),
                   default=60, help="seconds to wait for idle nodes")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    state_dir = args.state_dir or default_state_dir()
    if args.action == "up":
        saved = Testbed.from_state(state_dir)
        if saved.running():  # reattach; restarted only to add what was asked (accounting)
            saved.converge(bool(args.accounting), timeout=args.timeout)
            return 0
        given = {key: getattr(args, key) for key in UP_OPTIONS if getattr(args, key) is not None}
        if "ctld_port" in given:  # a second testbed's slurmdbd and MariaDB move with it
            given.update(dbd_port=given["ctld_port"] + 2, db_port=given["ctld_port"] + 13)
        Testbed(replace(saved.s, state_dir=state_dir, **given)).converge(timeout=args.timeout)
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
