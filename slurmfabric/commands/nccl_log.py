"""``slurmfabric nccl-log FILE...``: did NCCL use the fabric the way the plan says?

Exit codes: 0 OK; 1 FAIL (a communicator that failed, a socket fallback, an error WARN, GDR
off with --expect-gdr); 2 usage (no NCCL lines); 3 UNKNOWN: the log cannot answer what was
asked (--expect-gdr on a log with no network channel or GPU Direct RDMA line).
"""

from __future__ import annotations

import argparse
import json

from slurmfabric.errors import UsageError
from slurmfabric.nccl.log import LogReport, merge, parse_log


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurmfabric nccl-log",
        description="Summarise NCCL_DEBUG=INFO output per rank (network, devices, GPUDirect "
        "RDMA, channels, warnings); exit 1 on a failed communicator (a 'file.cc:N -> code' "
        "chain reaching init/group/enqueue: the first failing rank and its root line are "
        "named), a socket fallback, an error, or GDR off when --expect-gdr is given; exit 3 "
        "(UNKNOWN) when --expect-gdr is given and the log cannot tell (no network line).",
    )
    p.add_argument("files", nargs="*", default=["-"], help="log files; '-' or none reads stdin")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--expect-gdr", action="store_true",
                   help="treat NET/IB without GPUDirect RDMA as an error (the plan expects GDR)")
    p.add_argument("--allow-socket", action="store_true",
                   help="do not fail on NET/Socket (clusters without RDMA NICs)")
    return p


def _read(path: str):
    from slurmfabric._common.inputfile import iter_log_lines

    return iter_log_lines(path, "NCCL log")


def render_table(report: LogReport) -> str:
    head = ("RANK", "NODE:PID[DEV]", "NCCL", "NETWORK", "DEVICES / INTERFACES", "GDR", "CH", "WARN")
    rows = [head]
    for r in sorted(report.ranks, key=lambda r: (r.rank is None, r.rank or 0, r.key)):
        where = ",".join(r.net_devices) or ",".join(r.interfaces) or "-"
        gdr = {True: "yes", False: "NO", None: "-"}[r.gdr]
        rows.append((
            "-" if r.rank is None else str(r.rank), r.key, (r.version or "-").split("+")[0],
            r.network or "-", where, gdr, "-" if r.channels is None else str(r.channels),
            str(len(r.warnings)),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if report.problems:
        lines.append("")
        lines.append("problems:")
        for p in report.problems:
            lines.append(f"  {p.severity.upper()} [{p.kind}] {p.where}: {p.message}")
            lines.append(f"    fix: {p.remedy}")
    lines.append("")
    lines.append("result: " + report.verdict())
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    reports = [
        parse_log(_read(path), source=path, expect_gdr=args.expect_gdr,
                  allow_socket=args.allow_socket)
        for path in args.files
    ]
    report = merge(reports)
    if not report.ranks and not report.problems:
        raise UsageError(
            "no NCCL log lines found",
            hint="run with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET is enough) "
            "and pass its output",
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(render_table(report))
    return EXIT[report.verdict()]


EXIT = {"OK": 0, "FAIL": 1, "UNKNOWN": 3}  # 2 is a usage error
