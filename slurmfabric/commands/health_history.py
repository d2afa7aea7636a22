"""``slurmfabric health history``: the fleet's drains, resumes, flaps and lemon nodes.

Parses and prints only; ``slurmfabric.health.history`` decides what counts as what. The
records are slurmdbd's node events (``sacctmgr list events``), so it runs on any login node
that has Slurm's client commands, with no service beyond what Slurm runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time

from slurmfabric.commands._args import number


def add_parser(sub) -> None:
    p = sub.add_parser("history", help="drains, resumes, flaps and lemon nodes across the "
                       "cluster, from slurmdbd's node events (sacctmgr list events)")
    p.add_argument("--hours", type=number(0.01, 87600), default=168.0,
                   help="how far back to look (default 168: one week)")
    p.add_argument("--since", type=_when, metavar="YYYY-MM-DDTHH:MM:SS",
                   help="look back to this local time instead of --hours")
    p.add_argument("--nodes", help="only these nodes (a hostlist, e.g. gpu[001-128])")
    p.add_argument("--undo-s", type=number(0, 86400), default=30.0,
                   help="a slurmfabric drain that lasted at most this long is counted as "
                   "a circuit-breaker undo, not a drain (default 30)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--prometheus", metavar="FILE",
                   help="also write the per-node gauges to FILE (Prometheus text format, "
                   "for node_exporter's textfile collector), replaced atomically")


def _when(text: str) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time like 2026-12-01T08:00:00") \
            from None


def run(args: argparse.Namespace) -> int:
    from slurmfabric._common import files
    from slurmfabric.errors import SlurmCommandError, UsageError
    from slurmfabric.health import history
    from slurmfabric.slurm import cmd

    if args.nodes and args.nodes.startswith("-"):
        raise UsageError(f"--nodes {args.nodes!r} is not a hostlist",
                         hint="give node names, e.g. --nodes 'gpu[001-128]'")
    now = time.time()
    start = args.since.timestamp() if args.since else now - args.hours * 3600.0
    if start >= now:
        raise UsageError(f"--since {args.since:%Y-%m-%dT%H:%M:%S} is not in the past",
                         hint="give an earlier time, or --hours")
    try:
        rows = cmd.node_events(dt.datetime.fromtimestamp(start),
                                    dt.datetime.fromtimestamp(now), args.nodes)
    except SlurmCommandError as exc:
        raise UsageError(f"sacctmgr list events failed: {exc}",
                         hint="fleet history needs slurmdbd (AccountingStorageType="
                         "accounting_storage/slurmdbd) and sacctmgr on PATH") from None
    events = history.parse_events(rows)
    nodes = history.summarize(events, now, args.undo_s)
    if args.prometheus:
        files.write_atomic(args.prometheus,
                           history.as_prometheus(nodes, (now - start) / 3600.0))
    if args.json:
        print(json.dumps(history.as_json(events, nodes, start, now), indent=1))
    else:
        print(history.as_text(events, nodes, start, now, now, args.undo_s))
    return 0
