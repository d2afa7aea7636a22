"""``slurmfabric hostlist expand|compress|count|index``: Slurm hostlists, exactly."""

from __future__ import annotations

import argparse

from slurmfabric.errors import UsageError
from slurmfabric.slurm import hostlist

STDIN_MAX_BYTES = 16 << 20  # 100,000 names of 20 characters are 2 MB


def _stdin_expr() -> str:
    """Standard input as one expression (lines joined by ','), read like any input: capped,
    so /dev/zero on stdin is an error, not gigabytes in memory."""
    from slurmfabric._common.inputfile import read_text

    return read_text("-", "hostlist expression", STDIN_MAX_BYTES).replace("\n", ",")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="slurmfabric hostlist",
        description="Expand, compress, count or index Slurm hostlists the way Slurm does "
        "(order and duplicates kept). '-' reads the argument from stdin.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    expand = sub.add_parser("expand", help="one name per line (or --sep)")
    expand.add_argument("expr", nargs="+")
    expand.add_argument("--sep", default="\n", help="separator between names")
    compress = sub.add_parser("compress", help="names or expressions -> one ranged string")
    compress.add_argument("names", nargs="+")
    count = sub.add_parser("count", help="number of names, without expanding")
    count.add_argument("expr", nargs="+")
    index = sub.add_parser("index", help="0-based position of NAME in EXPR")
    index.add_argument("expr")
    index.add_argument("name")
    args = parser.parse_args(argv)

    stdin: list[str] = []  # read once: 'compress' walks the expressions twice

    def exprs(values: list[str]) -> list[str]:
        if "-" in values and not stdin:
            stdin.append(_stdin_expr())
        return [stdin[0] if v == "-" else v for v in values]

    if args.action == "expand":
        names = [n for e in exprs(args.expr) for n in hostlist.expand(e)]
        if names:
            print(args.sep.join(names))
    elif args.action == "compress":
        total = sum(hostlist.count(e) for e in exprs(args.names))
        if total > hostlist.MAX_HOSTS:
            raise UsageError(f"hostlist compress: {total} names, more than the limit of "
                             f"{hostlist.MAX_HOSTS}", "compress fewer names at a time")
        print(hostlist.compress(n for e in exprs(args.names) for n in hostlist.iter_hosts(e)))
    elif args.action == "count":
        print(sum(hostlist.count(e) for e in exprs(args.expr)))
    else:
        print(hostlist.index(args.expr, args.name))
    return 0
