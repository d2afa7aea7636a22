"""``slurmfabric nccl-tests parse FILE``: read nccl-tests results and compare with the fabric.

Exit codes: 0 OK; 1 FAIL (#wrong > 0, out-of-bounds values, no rows, bandwidth below the
expectation); 2 usage; 3 UNKNOWN: an expectation was given and the sweep ended below the
size where bus bandwidth saturates, so it cannot say.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from itertools import chain

from slurmfabric.commands._args import number
from slurmfabric.errors import UsageError
from slurmfabric.nccl.tests import (
    TestRun,
    discover_fabric,
    expected_busbw,
    iter_runs,
    judge,
    nominal_gbytes,
    parse_json,
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
        "(InfiniBand or RoCE). Exit 1 on data errors or bandwidth below the expectation; "
        "3 (cannot tell) when an expectation is given and the sweep ends below 1 GiB. "
        "Reads the text output (launcher tags anywhere) or the -J JSON file.",
    )
    parse_p.add_argument("file", help="nccl-tests output or its -J JSON file ('-' for stdin)")
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
    curve = parse_p.add_argument_group("bandwidth against message size (nccl/curve.py)")
    curve.add_argument("--svg", metavar="FILE", help="draw busbw per size beside the curve "
                       "the fabric should give (one file per run: FILE, FILE-2, ...)")
    curve.add_argument("--html", metavar="FILE", help="the same as a self-contained page")
    curve.add_argument("--curve", action="store_true", help="judge every size against the "
                       "expected curve (implied by --svg/--html)")
    curve.add_argument("--nodes", type=number(1, 100000, integer=True),
                       help="nodes of the run (default: the hosts its device table names)")
    curve.add_argument("--gpus-per-node", type=number(1, 64, integer=True),
                       help="GPUs per node (default: ranks / nodes, else 8)")
    curve.add_argument("--gpu", default="h100", choices=("h100", "h200", "a100", "b200"))
    curve.add_argument("--algo", help="the NCCL_ALGO the run forced (ring, tree, nvls, ...); "
                       "default: NCCL's own pick per size")
    return p


def _curve(run: TestRun, args: argparse.Namespace, rates: list[float] | None, index: int):
    """The run against the expected curve, drawn where asked; None when not asked."""
    from slurmfabric.nccl import curve

    if not (args.curve or args.svg or args.html):
        return None
    nodes = args.nodes or len(run.hosts) or 1
    ranks = len(run.devices)
    per_node = args.gpus_per_node or (ranks // nodes if ranks >= nodes else 8)
    shape = curve.Shape(nodes, per_node, tuple(rates or ()), args.fabric, args.gpu, args.algo)
    try:
        got = curve.judge(run.collective, [(r.size, r.busbw) for r in run.rows], shape)
    except ValueError as exc:  # an --algo the model does not run for this op
        raise UsageError(f"--algo {args.algo!r}: {exc}") from None
    title = f"{run.collective or 'nccl-tests'}: {nodes} node(s) x {per_node} {args.gpu}"
    for path, body in ((args.svg, curve.svg), (args.html, curve.html)):
        if path:
            from slurmfabric._common.files import write_atomic

            stem, dot, ext = path.rpartition(".")
            target = path if index == 0 else (f"{stem}-{index + 1}.{ext}" if dot
                                              else f"{path}-{index + 1}")
            write_atomic(target, body(got, title), 0o644)
    return got


CURVE_STATE = {"OK": "OK", "SHORT": "FAIL", "CANNOT_TELL": "UNKNOWN"}


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


def _fabric_line(rates: list[float], fabric: str = "ib") -> str:
    low, high = expected_busbw(rates, fabric)
    kind = "" if fabric == "ib" else f" {fabric.upper()}"
    return (f"fabric: {len(rates)}{kind} ports, {nominal_gbytes(rates):.0f} GB/s line rate -> "
            f"expected busbw {low:.0f}-{high:.0f} GB/s on large messages")


def _render_run(run: TestRun, verdict) -> str:
    name = run.collective or "nccl-tests"
    hosts = ", ".join(run.hosts) or "?"
    lines = [f"{name}: {len(run.devices) or '?'} ranks on {hosts}",
             f"  {'size (B)':>12}  {'busbw oop':>9}  {'busbw ip':>8}  {'#wrong':>6}"]
    for row in run.rows:
        wrong = "N/A" if row.out_of_place.wrong is None else str(row.wrong)
        lines.append(
            f"  {row.size:>12}  {row.out_of_place.busbw:>9.2f}  "
            f"{row.in_place.busbw:>8.2f}  {wrong:>6}"
        )
    if run.rows_total > len(run.rows):
        lines.append(f"  ... {run.rows_total - len(run.rows)} more rows judged, not shown")
    if run.avg_busbw is not None:
        lines.append(f"  avg bus bandwidth {run.avg_busbw:g} GB/s")
    lines += [f"  {finding}" for finding in verdict.findings]
    lines.append(f"  result: {verdict.state}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.fabric = "ib"
    rates = _rates(args)
    runs = _read_runs(args.file)
    first = next(runs, None)
    if first is None:
        raise UsageError(
            f"{args.file}: no nccl-tests output found",
            hint="pass the stdout of all_reduce_perf (or another *_perf binary)",
        )
    # one run at a time, printed as it is judged: a 200 MB output keeps no run it printed
    states = set()
    if args.json:
        print('{\n "runs": [')
    elif rates:
        print(_fabric_line(rates, args.fabric))
    for count, run in enumerate(chain([first], runs)):
        verdict = judge(run, rates, args.expect_busbw, args.fabric)
        states.add(verdict.state)
        got = _curve(run, args, rates, count)
        if got is not None:
            states.add(CURVE_STATE[got.state])
        if args.json:
            extra = {} if got is None else {"curve": {
                "state": got.state, "findings": got.findings,
                "points": [vars(p) for p in got.points]}}
            body = json.dumps(dict(run.to_dict(), verdict=verdict.to_dict(), **extra),
                              indent=2)
            print(("," if count else "") + body)
        else:
            print(_render_run(run, verdict))
            if got is not None:
                print("\n".join(f"  curve: {line}" for line in got.findings)
                      + f"\n  curve result: {got.state}")
    state = worst(states)
    if args.json:
        print(f'], "ok": {json.dumps(state == "OK")}, "verdict": "{state}"}}')
    return EXIT[state]


EXIT = {"OK": 0, "FAIL": 1, "UNKNOWN": 3}  # 2 is a usage error


def worst(states) -> str:
    found = set(states)
    return next((s for s in ("FAIL", "UNKNOWN") if s in found), "OK")


def _read_runs(path: str) -> Iterator[TestRun]:
    """The output's runs as they end, read line by line (bounded memory); a file that
    starts with ``{`` is nccl-tests' -J JSON, which it writes as one line (util.cu prints
    no newline), so that file is read whole, not cut into lines."""
    from slurmfabric._common import inputfile

    if path == "-":  # standard input cannot be read twice: peek at it, then stream it
        head = sys.stdin.buffer.peek(64)[:64] if hasattr(sys.stdin.buffer, "peek") else b""
        if head.lstrip()[:1] == b"{":  # -J JSON, one line: whole, within the cap
            return iter(parse_json(inputfile.read_text(path, "nccl-tests JSON",
                                                       inputfile.RESULT_MAX_BYTES), path))
        return iter_runs(inputfile.iter_log_lines(path, "nccl-tests output"))
    lines = inputfile.iter_log_lines(path, "nccl-tests output")
    first = next(lines, "")
    while first.strip() == "" and first:
        first = next(lines, "")
    if first.lstrip().startswith("{"):
        lines.close()
        return iter(parse_json(inputfile.read_text(path, "nccl-tests JSON",
                                                   inputfile.RESULT_MAX_BYTES), path))
    return iter_runs(chain([first], lines))
