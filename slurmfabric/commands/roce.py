"""``slurmfabric roce facts|audit|report``: RoCE lossless settings and counters, on this
node or across a cluster. Decisions live in slurmfabric/roce/; this module parses and
prints."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from slurmfabric.commands._args import number
from slurmfabric.errors import UsageError


def _tool_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sysfs-root", help="read sysfs under this root; {node} is replaced by "
                   "the node's name (test clusters, containers)")
    p.add_argument("--ethtool", default="/usr/sbin/ethtool", help="ethtool path ('' : none)")
    p.add_argument("--mlnx-qos", default="/usr/bin/mlnx_qos", help="mlnx_qos path ('' : none)")
    p.add_argument("--dcb", default="/usr/sbin/dcb", help="iproute2 dcb path ('' : none)")
    p.add_argument("--tool-timeout", type=number(0.1, 120), default=5.0,
                   help="seconds before a tool is killed (default 5)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slurmfabric roce", description="RoCE lossless setup: "
                                "trust, PFC, ECN, ToS, MTU and the pause/loss counters.")
    sub = p.add_subparsers(dest="action", required=True)
    f = sub.add_parser("facts", help="this node's RoCE ports")
    _tool_options(f)
    f.add_argument("--json", action="store_true")
    f.add_argument("--output-dir", help="write <node>.<sample>.json here (what 'roce audit' "
                   "runs on every node)")
    f.add_argument("--sample", type=number(0, 1, integer=True), default=0)
    a = sub.add_parser("audit", help="sample every node's RoCE ports twice in one Slurm "
                       "step; then 'roce report'. With --switch: check the switches' saved "
                       "outputs against the hosts' plan")
    a.add_argument("--nodes", help="hostlist, e.g. gpu[001-064]")
    a.add_argument("--results", help="absolute directory all nodes share (with --switch: "
                   "the hosts' plan comes from the samples there)")
    a.add_argument("--switch", action="append", default=[], metavar="[FORMAT:]FILE",
                   help="a switch's saved output (FORMAT sonic|cumulus|onyx|eos, else "
                   "detected; the switch is named after the file); repeatable")
    a.add_argument("--priority", type=number(0, 7, integer=True),
                   help="the hosts' PFC priority (with --switch; else from --results)")
    a.add_argument("--dscp", type=number(0, 63, integer=True),
                   help="the DSCP the hosts mark RoCE with (with --switch; ToS >> 2)")
    a.add_argument("--interval", type=number(1, 3600), default=10.0,
                   help="seconds between the two samples (counter growth; default 10)")
    a.add_argument("--partition")
    a.add_argument("--time", dest="time_limit", help="job time limit")
    a.add_argument("--sbatch-arg", action="append", default=[])
    a.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    _tool_options(a)
    r = sub.add_parser("report", help="nodes that differ from the majority or the profile, "
                       "worst first; fastest-growing loss and pause counters")
    r.add_argument("results")
    r.add_argument("--health-config", metavar="FILE", help="site health config: each node's "
                   "roce_profile ([[nodes]]) is checked too")
    r.add_argument("--prom", metavar="FILE", help="write a Prometheus textfile here")
    r.add_argument("--json", action="store_true")
    return p


def _tools(args: argparse.Namespace):
    from slurmfabric.roce.facts import Tools

    return Tools(ethtool=args.ethtool or None, mlnx_qos=args.mlnx_qos or None,
                 dcb=args.dcb or None, timeout=args.tool_timeout)


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def _root(pattern: str | None) -> str:
    """--sysfs-root with {node} filled in, as the TaskProlog does it."""
    from slurmfabric.site.taskprolog import sysfs_root

    try:
        return sysfs_root(pattern, {"SLURMD_NODENAME": _node()}) or "/"
    except ValueError as error:
        raise UsageError(str(error)) from None


def _facts(args: argparse.Namespace) -> int:
    from slurmfabric.roce.facts import collect

    ports = collect(_root(args.sysfs_root), _tools(args))
    data = {"node": _node(), "time": time.time(), "ports": [p.to_dict() for p in ports]}
    if args.output_dir:
        from slurmfabric._common.files import safe_name
        from slurmfabric.site.install import write_atomic

        out = Path(args.output_dir) / f"{safe_name(data['node'])}.{args.sample}.json"
        write_atomic(out, json.dumps(data, indent=1) + "\n", 0o644)
        print(out)
        return 0
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    if not ports:
        print("no RoCE ports (no RDMA port with link layer Ethernet)")
        return 0
    for port in ports:
        pfc = [p for p, on in enumerate(port.pfc or ()) if on]
        ecn = [p for p, on in enumerate(port.ecn_np or ()) if on and port.ecn_rp
               and port.ecn_rp[p]]
        print(f"{port.label()}: mtu {port.mtu} trust {port.trust or '?'} PFC "
              f"{pfc if port.pfc is not None else '?'} ECN {ecn if port.ecn_np else '?'} "
              f"ToS {port.roce_tos if port.roce_tos is not None else '?'}")
        for line in port.unseen:
            print(f"  not seen: {line}")
    return 0


def _switches(args: argparse.Namespace) -> int:
    """--switch: every switch port against the hosts' plan; 1 when any finding."""
    from slurmfabric.roce import switch

    if (args.priority is None) != (args.dscp is None):
        raise UsageError("--priority and --dscp go together", hint="give both, or neither "
                         "and --results of a finished audit")
    if args.priority is not None:
        plan = switch.Plan(args.priority, args.dscp, "--priority/--dscp")
    elif args.results:
        from slurmfabric.roce import audit

        plan = switch.plan_from_hosts(audit.load(Path(args.results)))
        if plan is None:
            raise UsageError(f"--results {args.results}: no host sample shows one PFC "
                             "priority and a RoCE ToS", hint="give --priority and --dscp")
    else:
        raise UsageError("--switch needs the hosts' plan", hint="give --results DIR of a "
                         "finished audit, or --priority and --dscp")
    ports = [port for spec in args.switch for port in switch.read(spec)]
    print(f"switch check: {len(ports)} port{'' if len(ports) == 1 else 's'} against the "
          f"host plan: priority {plan.priority}, DSCP {plan.dscp} ({plan.source})")
    bad = False
    for port in ports:
        found, unseen = switch.check(port, plan)
        bad = bad or bool(found)
        for line in found:
            print(line)
        for line in unseen:
            print(f"not seen: {line}")
    if not bad:
        print("no switch port differs from the host plan")
    return 1 if bad else 0


def _audit(args: argparse.Namespace) -> int:
    from slurmfabric._common.executable import this_executable
    from slurmfabric.job import submit
    from slurmfabric.job.render import environment
    from slurmfabric.slurm import steps
    from slurmfabric.slurm.hostlist import expand

    if args.switch:
        if args.nodes:
            raise UsageError("--switch checks saved switch outputs; --nodes submits a job",
                             hint="run them as two commands")
        return _switches(args)
    if not args.nodes or not args.results:
        raise UsageError("roce audit needs --nodes and --results (or --switch FILE)",
                         hint="e.g. --nodes 'gpu[001-064]' --results /shared/roce1")
    nodes = expand(args.nodes)
    results = Path(args.results)
    if not results.is_absolute():
        raise UsageError(f"--results {results} must be absolute",
                         hint="the compute nodes write there; use a shared path")
    facts = [this_executable(), "roce", "facts", "--output-dir", str(results),
             "--ethtool", args.ethtool, "--mlnx-qos", args.mlnx_qos, "--dcb", args.dcb,
             "--tool-timeout", f"{args.tool_timeout:g}"]
    if args.sysfs_root:
        facts += ["--sysfs-root", args.sysfs_root]
    directives = [*steps.pinned_job_options(
        nodes, job_name="sf-roce-audit", output=results / "job-%j.out",
        partition=args.partition, time_limit=args.time_limit), *args.sbatch_arg]
    from slurmfabric import __version__

    script = environment().get_template("roce-audit.sh.j2").render(
        directives=directives, facts=facts, interval=f"{args.interval:g}",
        step=steps.exact_step_options(len(nodes), 1, exact=False), nodes=nodes,
        results=str(results), version=__version__)
    request = submit.SubmitRequest(script=script, backend="sbatch", workdir=str(results))
    if args.dry_run:
        print(request.describe(), end="")
        return 0
    results.mkdir(parents=True, exist_ok=True)
    job_id = submit.submit(request)
    print(f"submitted job {job_id}: {len(nodes)} nodes, two samples {args.interval:g} s apart;"
          f" then run: slurmfabric roce report {results}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from slurmfabric.roce import audit

    samples = audit.load(Path(args.results))
    if not samples:
        raise UsageError(f"{args.results}: no <node>.<sample>.json files",
                         hint="run 'slurmfabric roce audit' first (or roce facts --output-dir)")
    profiles = None
    if args.health_config:
        from slurmfabric.health import siteconfig
        from slurmfabric.health.checks import roce as health_roce

        profiles = {}
        for node in samples:
            expect = siteconfig.load(node, args.health_config).expect
            if expect.get("roce_profile"):
                profiles[node] = health_roce.profile_from(expect)
    report = audit.analyze(samples, profiles)
    if args.prom:
        from slurmfabric._common.prom import write_textfile

        write_textfile(args.prom, audit.prometheus(samples, report))
    if args.json:
        print(audit.to_json(report))
    else:
        print(f"RoCE audit: {len(report.nodes)} nodes, {len(report.findings)} with settings "
              "that differ")
        for finding in report.findings:
            print(f"{finding.node}:")
            for problem in finding.problems:
                print(f"  {problem}")
        for growth in report.growth[:20]:
            print(f"growing: {growth.line()}")
        for node in report.missing:
            print(f"! {node}: only one sample (the second step did not run there)")
        for node, lines in report.unseen.items():
            print(f"not seen on {node}: " + "; ".join(lines[:3]))
    bad = report.findings or any(g.loss_per_s > 0 for g in report.growth) or report.missing
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "facts":
        return _facts(args)
    if args.action == "audit":
        return _audit(args)
    return _report(args)
