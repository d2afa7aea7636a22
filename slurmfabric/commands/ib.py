"""``slurmfabric ib``: audit the InfiniBand fabric and show its link table.

    slurmfabric ib audit [--json] [--prom FILE] [--baseline FILE] [--save FILE] ...
    slurmfabric ib links [--node NAME] [--local] [--json] [--input FILE]

Exit status of ``audit``: 0 when nothing was found, 1 when there are findings, 2 on usage
errors. The tools (iblinkinfo, perfquery, ibstat) are taken from PATH, from
``--<tool> PATH`` or ``SLURMFABRIC_<TOOL>``; ``--ibdiag-args`` (or SLURMFABRIC_IBDIAG_ARGS)
is added to every call, e.g. ``-C mlx5_0 -P 1``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from slurmfabric._common.textcheck import split_args
from slurmfabric.commands._args import number
from slurmfabric.errors import UsageError
from slurmfabric.ibaudit import audit as fa
from slurmfabric.ibaudit import names, parse, runner


def _tool_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tools")
    for tool in runner.TOOLS:
        group.add_argument(f"--{tool}", metavar="PATH", help=f"path of {tool}")
    group.add_argument("--ibdiag-args", metavar="ARGS", help="extra arguments for every tool")
    group.add_argument("--timeout", type=number(0, 3600, low_open=True),
                       default=60.0, help="seconds per tool call")
    group.add_argument("--jobs", type=number(1, 256, integer=True),
                       default=8, help="concurrent perfquery calls")
    naming = parser.add_argument_group("node names")
    naming.add_argument("--node-map", metavar="FILE", help="node-name-map file: 0xGUID \"node\"")
    naming.add_argument(
        "--name-pattern", metavar="REGEX", help="regex on the node description; group 1 = node"
    )


def _tools(args: argparse.Namespace) -> runner.Tools:

    tools = runner.Tools.from_env()
    for tool in runner.TOOLS:
        path = getattr(args, tool, None)
        if path:
            tools.paths[tool] = path
    if args.ibdiag_args is not None:
        tools.extra_args = split_args(args.ibdiag_args, "--ibdiag-args")
    tools.timeout = args.timeout
    tools.jobs = args.jobs
    return tools


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmfabric ib", description="InfiniBand fabric audit with infiniband-diags"
    )
    sub = parser.add_subparsers(dest="action", required=True)

    p_audit = sub.add_parser("audit", help="find degraded/down links and erroring ports")
    p_audit.add_argument("--json", action="store_true", help="print the audit as JSON")
    p_audit.add_argument("--prom", metavar="FILE", help="write Prometheus textfile metrics")
    p_audit.add_argument("--baseline", metavar="FILE", help="previous audit (--save/--json)")
    p_audit.add_argument("--save", metavar="FILE", help="save this audit for a later --baseline")
    p_audit.add_argument("--topology", metavar="FILE", help="expected ibnetdiscover topology")
    p_audit.add_argument("--expect-nodes", metavar="LIST", help="nodes that must be present")
    p_audit.add_argument("--expect-width", metavar="WIDTH", help="minimum width, e.g. 4X")
    p_audit.add_argument("--expect-rate", metavar="GBPS", type=number(0, 10000, low_open=True),
                         help="minimum Gb/s")
    p_audit.add_argument(
        "--threshold", metavar="NAME=N", action="append", default=[],
        help="error counter threshold (repeatable), e.g. SymbolErrorCounter=0",
    )
    p_audit.add_argument(
        "--thresholds-file", metavar="FILE",
        help="thresholds in ibqueryerrors' error_thresholds format",
    )
    p_audit.add_argument("--no-counters", action="store_true", help="skip perfquery")
    p_audit.add_argument("--input", metavar="FILE", help="recorded 'iblinkinfo --line' output")
    p_audit.add_argument("--drain", action="store_true", help="drain nodes with findings")
    p_audit.add_argument("--health-config", metavar="FILE", help="site health config whose "
                         "[runner] drain policy --drain follows (default: "
                         "$SLURMFABRIC_HEALTH_CONFIG or /etc/slurmfabric/health.toml)")
    _tool_options(p_audit)

    p_routes = sub.add_parser("routes", help="the routes the subnet manager programmed "
                              "(switch LFTs) against the cabling's shortest, and up-link balance")
    p_routes.add_argument("--json", action="store_true")
    p_routes.add_argument("--nodes", metavar="LIST", help="only pairs of these nodes (hostlist)")
    p_routes.add_argument("--input", metavar="FILE", help="recorded 'iblinkinfo --line' output")
    p_routes.add_argument("--lfts", metavar="FILE", help="recorded LFTs: 'ibroute LID' of every "
                          "switch, concatenated (dump_lfts.sh)")
    _tool_options(p_routes)

    p_links = sub.add_parser("links", help="show the parsed link table")
    p_links.add_argument("--node", metavar="NAME", help="only links of this node")
    p_links.add_argument("--local", action="store_true", help="this host's ports (ibstat)")
    p_links.add_argument("--json", action="store_true")
    p_links.add_argument("--input", metavar="FILE", help="recorded iblinkinfo/ibstat output")
    _tool_options(p_links)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "links":
        return _links(args)
    if args.action == "routes":
        return _routes(args)
    return _audit(args)


def _routes(args: argparse.Namespace) -> int:
    from slurmfabric.ibaudit import routes

    if bool(args.input) != bool(args.lfts):
        raise UsageError("--input and --lfts go together (the cabling and the tables)",
                         hint="record both, or give neither to read the fabric now")
    tools = _tools(args)
    namer = names.load_namer(args.node_map, args.name_pattern)
    text = _read(args.input, "iblinkinfo output") if args.input else runner.iblinkinfo(tools)
    ports = parse.parse_iblinkinfo(text)
    if args.lfts:
        tables = _read(args.lfts, "LFT dump")
    else:
        lids = {p.lid for p in ports if p.node_type == "Switch" and p.lid}
        tables = runner.lfts(tools, lids)
    switches = routes.parse_ibroute(tables)
    if not switches:
        raise UsageError(f"{args.lfts or 'ibroute'}: no switch forwarding table found",
                         hint="record them with 'ibroute LID' for every switch (dump_lfts.sh)")
    fabric = routes.build(ports, switches, namer)
    findings = routes.check(fabric, set(_expect_nodes(args.nodes)) or None)
    if args.json:
        print(json.dumps({"switches": len(switches), "hcas": len(fabric.hcas),
                          "findings": [f.to_dict() for f in findings]}, indent=2))
    else:
        print(routes.format_findings(findings))
    return 1 if findings else 0


def _read(path: str, what: str) -> str:
    from slurmfabric._common.inputfile import read_text

    return read_text(path, what, lenient=True)


def _links_of(text: str, args: argparse.Namespace, namer: names.NodeNamer) -> list[fa.Link]:
    """The fabric's links; an input with none is an error, never an audit that passes."""
    links = fa.build_links(parse.parse_iblinkinfo(text), namer)
    if not links:
        where = args.input or "iblinkinfo"
        raise UsageError(f"{where}: no links found in the iblinkinfo output",
                         "record it with 'iblinkinfo --switches-only -l' or run on a node "
                         "that sees the fabric")
    return links


def _links(args: argparse.Namespace) -> int:
    tools = _tools(args)
    if args.local:
        text = _read(args.input, "ibstat output") if args.input else runner.ibstat(tools)
        ports = parse.parse_ibstat(text)
        if args.json:
            print(json.dumps([asdict(p) for p in ports], indent=2))
            return 0
        for p in ports:
            print(f"{p.ca}/{p.port}  {p.state}/{p.phys}  rate {p.rate:g}  lid {p.lid}  "
                  f"{p.link_layer}")
        return 0
    namer = names.load_namer(args.node_map, args.name_pattern)
    text = _read(args.input, "iblinkinfo output") if args.input else runner.iblinkinfo(tools)
    links = _links_of(text, args, namer)
    if args.node:
        links = [link for link in links if link.node == args.node]
        if not links:
            raise UsageError(f"no up link of node {args.node!r} in the fabric",
                             hint="check the name with 'slurmfabric ib links'")
    if args.json:
        print(json.dumps([link.to_dict() for link in links], indent=2))
    else:
        print(fa.format_links(links))
    return 0


def _thresholds(args: argparse.Namespace) -> dict[str, int]:
    out: dict[str, int] = {}
    items: list[tuple[str, str]] = []
    if args.thresholds_file:
        for line in _read(args.thresholds_file, "thresholds file").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                items.append((args.thresholds_file, line))
    items += [("--threshold", item) for item in args.threshold]
    for source, item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise UsageError(f"{source}: expected NAME=N, got {item!r}",
                             hint="e.g. --threshold SymbolErrorCounter=0")
        out[name.strip()] = int(value)
    return out


def _expect_nodes(text: str | None) -> list[str]:
    if not text:
        return []
    from slurmfabric.slurm import hostlist

    return list(hostlist.expand(text))


def _audit(args: argparse.Namespace) -> int:
    from slurmfabric.ibaudit.document import AuditDocument, load_baseline

    policy = None
    if args.drain:  # the site's drain policy, read before the audit changes anything
        import socket

        from slurmfabric.health.drain import DrainPolicy

        policy = DrainPolicy.load(socket.gethostname().split(".")[0], args.health_config)
    tools = _tools(args)
    namer = names.load_namer(args.node_map, args.name_pattern)
    thresholds = _thresholds(args)
    text = _read(args.input, "iblinkinfo output") if args.input else runner.iblinkinfo(tools)
    links = _links_of(text, args, namer)
    counters: dict[str, dict[str, int]] = {}
    errors: list[str] = []
    if not args.no_counters and not args.input:
        counters, errors = runner.collect_link_counters(tools, links)
    expected: list[fa.Link] = []
    baseline_counters = None
    if args.baseline:
        base = load_baseline(args.baseline)
        expected += base.links
        baseline_counters = base.counters
    if args.topology:
        topo = parse.parse_ibnetdiscover(_read(args.topology, "topology"))
        expected += fa.expected_from_topology(topo, namer)
    findings = fa.audit(
        links,
        counters,
        expected=expected,
        expect_nodes=_expect_nodes(args.expect_nodes),
        baseline_counters=baseline_counters,
        thresholds=thresholds,
        expect_width=args.expect_width,
        expect_rate=args.expect_rate,
    )
    document = AuditDocument(created=time.time(), findings=findings, links=links,
                             counters=counters, errors=errors)
    if args.save:
        document.save(args.save)
    if args.prom:
        from slurmfabric._common.prom import write_textfile
        from slurmfabric.ibaudit import metrics

        write_textfile(args.prom, metrics.render(links, counters, findings, document.created))
    if args.json:
        print(json.dumps(document.to_dict(), indent=2))
    else:
        print(fa.format_table(findings))
        for error in errors:
            print(f"slurmfabric: warning: counters not read: {error}", file=sys.stderr)
    if policy is not None:  # --drain
        from slurmfabric.ibaudit.drain import drain_findings

        for node, outcome in drain_findings(findings, policy):
            note = f" ({outcome.detail})" if outcome.detail else ""
            print(f"drain {node}: {outcome.outcome}{note}", file=sys.stderr)
    return 1 if findings else 0
