"""``slurmfabric nccl-tests parse FILE``: read nccl-tests results and compare with the fabric."""

from __future__ import annotations

import argparse
import json
import sys

from slurmfabric.commands._args import number
from slurmfabric.errors import UsageError
from slurmfabric.nccl.tests import (
    TestRun,
    discover_fabric,
    expected_busbw,
    judge,
    nominal_gbytes,
    parse,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurmfabric nccl-tests",
        description="Work with nccl-tests output (all_reduce_perf, all_gather_perf, ...).",
    )
    sub = p.add_subparsers(dest="action", required=True)
    parse_p = sub.add_parser(
        "parse",
        help="parse an output file; flag #wrong > 0 always, low bandwidth against an expectation",
        description="Parse nccl-tests output. Expected bus bandwidth (the whatif model): the "
        "rail count x one rail's effective rate, 0.96 of its line rate on InfiniBand, less "
        "10 %% (8 x 400 Gb/s -> 346-384 GB/s); with --discover the node's rails and fabric "
        "(InfiniBand or RoCE). Exit 1 on data errors or bandwidth below the expectation.",
    )
    parse_p.add_argument("file", help="nccl-tests output ('-' for stdin)")
    parse_p.add_argument("--json", action="store_true")
    how = parse_p.add_mutually_exclusive_group()
    how.add_argument("--rates", help="NIC port rates in Gb/s, comma-separated (400,400,...)")
    how.add_argument("--ports", type=number(1, 1024, integer=True),
                     help="number of NIC ports per node (with --port-rate)")
    how.add_argument("--discover", action="store_true",
                     help="expect the rate of the rails the plan picks on this node (ACTIVE "
                     "ports near a GPU; storage/frontend NICs left out)")
    how.add_argument("--expect-busbw", type=number(0, 100000, low_open=True),
                     help="minimum busbw in GB/s")
    parse_p.add_argument("--port-rate", type=number(0, 10000, low_open=True), default=400.0,
                         help="Gb/s per port with --ports (default 400)")
    parse_p.add_argument("--sysfs-root", help="root for --discover (tests, containers)")
    return p


def _rates(args: argparse.Namespace) -> list[float] | None:
    if args.rates is not None:  # "--rates ''" is a mistake, not "no expectation"
        import argparse as _argparse

        from slurmfabric.commands._args import rates

        try:
            return rates(args.rates)
        except _argparse.ArgumentTypeError as exc:
            raise UsageError(f"--rates {args.rates!r}: {exc}") from None
    if args.ports:
        return [args.port_rate] * args.ports
    if args.discover:
        rates, names, args.fabric = discover_fabric(args.sysfs_root)
        if not rates:
            raise UsageError(
                "no rail NIC found on this node (slurmfabric topo --explain says why)",
                hint="pass --rates or --ports/--port-rate, or run on a node with RDMA NICs",
            )
        print(f"rails: {', '.join(names)}", file=sys.stderr)
        return rates
    return None


def _render(runs: list[TestRun], verdicts, rates, fabric: str = "ib") -> str:
    lines = []
    if rates:
        low, high = expected_busbw(rates, fabric)
        kind = "" if fabric == "ib" else f" {fabric.upper()}"
        lines.append(
            f"fabric: {len(rates)}{kind} ports, {nominal_gbytes(rates):.0f} GB/s line rate -> "
            f"expected busbw {low:.0f}-{high:.0f} GB/s on large messages"
        )
    for run, verdict in zip(runs, verdicts):
        name = run.collective or "nccl-tests"
        hosts = ", ".join(run.hosts) or "?"
        lines.append(f"{name}: {len(run.devices) or '?'} ranks on {hosts}")
        lines.append(f"  {'size (B)':>12}  {'busbw oop':>9}  {'busbw ip':>8}  {'#wrong':>6}")
        for row in run.rows:
            wrong = "N/A" if row.out_of_place.wrong is None else str(row.wrong)
            lines.append(
                f"  {row.size:>12}  {row.out_of_place.busbw:>9.2f}  "
                f"{row.in_place.busbw:>8.2f}  {wrong:>6}"
            )
        if run.avg_busbw is not None:
            lines.append(f"  avg bus bandwidth {run.avg_busbw:g} GB/s")
        for finding in verdict.findings:
            lines.append(f"  {finding}")
        lines.append(f"  result: {'OK' if verdict.ok else 'FAIL'}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.fabric = "ib"
    rates = _rates(args)
    from slurmfabric._common.inputfile import read_log_lines

    text = read_log_lines(args.file, "nccl-tests output")
    runs = parse(text)
    if not runs:
        raise UsageError(
            f"{args.file}: no nccl-tests output found",
            hint="pass the stdout of all_reduce_perf (or another *_perf binary)",
        )
    verdicts = [judge(run, rates, args.expect_busbw, args.fabric) for run in runs]
    if args.json:
        print(json.dumps(
            {"runs": [dict(run.to_dict(), verdict=v.to_dict()) for run, v in zip(runs, verdicts)],
             "ok": all(v.ok for v in verdicts)},
            indent=2,
        ))
    else:
        print(_render(runs, verdicts, rates, args.fabric))
    return 0 if all(v.ok for v in verdicts) else 1
