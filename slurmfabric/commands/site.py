"""``slurmfabric site taskprolog|cli-filter|install``: the cluster-wide hooks.

``taskprolog`` runs before every task on the cluster, so it has its own tiny option parser
(no argparse); the decisions live in slurmfabric/site/.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported on use: the TaskProlog path starts without argparse
    import argparse

USAGE = """\
usage: slurmfabric site taskprolog [--sysfs-root PATTERN] [--fabric-type T] [--no-plan]
       slurmfabric site cli-filter --config SITE.toml [-o cli_filter.lua]
       slurmfabric site install DIR [--config SITE.toml] [--python PATH]
                                    [--sysfs-root PATTERN] [--fabric-type T]

  taskprolog   print the node's NCCL plan and this task's rank variables as 'export' lines
               (what slurm.conf TaskProlog= runs); never replaces a value the task has;
               SLURMFABRIC_TASKPROLOG=off in the job's environment turns it off
  cli-filter   write cli_filter.lua from the [cli_filter] table of the site config
  install      write slurmfabric-taskprolog and cli_filter.lua into DIR and print the
               slurm.conf lines that enable them
"""


def taskprolog_main(argv: list[str]) -> int:
    """The installed TaskProlog's entry point (taskprolog/slurmfabric-taskprolog)."""
    from slurmfabric.site import taskprolog

    root = fabric = None
    plan = True
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in ("--sysfs-root", "--fabric-type"):
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            if name == "--sysfs-root":
                root = value
            else:
                fabric = value
        elif argv[i] == "--no-plan":
            plan = False
        else:  # a TaskProlog must not fail the task: say so and export nothing
            print(f"slurmfabric taskprolog: unknown option {argv[i]!r}; no variables set",
                  file=sys.stderr)
            return 0
        i += 1
    return taskprolog.main(dict(os.environ), root, fabric, plan)


def build_parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(prog="slurmfabric site", description="Cluster-wide hooks: "
                                "TaskProlog and cli_filter for every job on the cluster.")
    sub = p.add_subparsers(dest="action", required=True)
    f = sub.add_parser("cli-filter", help="write cli_filter.lua from the site config")
    f.add_argument("--config", required=True, help="site config (TOML) with a [cli_filter] "
                   "table")
    f.add_argument("-o", "--output", help="file to write (default: print it)")
    i = sub.add_parser("install", help="write the TaskProlog and cli_filter.lua into DIR")
    i.add_argument("dest")
    i.add_argument("--config", help="site config with a [cli_filter] table (without it no "
                   "cli_filter.lua is written)")
    i.add_argument("--python", help="absolute path of the Python slurmfabric is installed "
                   "in (default: the one running now)")
    i.add_argument("--sysfs-root", help="TaskProlog --sysfs-root PATTERN ({node}: the node "
                   "name); for test clusters")
    i.add_argument("--fabric-type", help="TaskProlog --fabric-type (default auto)")
    return p


def main(argv: list[str]) -> int:
    if argv[:1] == ["taskprolog"]:
        return taskprolog_main(argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    args = build_parser().parse_args(argv)
    from slurmfabric.site import clifilter, install

    if args.action == "cli-filter":
        text = clifilter.render(clifilter.load(args.config))
        if args.output:
            install.write_atomic(args.output, text, 0o644)
            print(args.output)
        else:
            print(text, end="")
        return 0
    written = install.install(args.dest, python=args.python or sys.executable,
                              config=args.config, sysfs_root=args.sysfs_root,
                              fabric_type=args.fabric_type)
    for path in written.files:
        print(path)
    print("\n# add to slurm.conf (then: scontrol reconfigure):")
    for line in written.conf_lines:
        print(line)
    return 0
