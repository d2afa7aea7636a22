"""``slurmfabric health check|prolog|epilog|periodic|burn-in|resume|install-hooks|versions|
history``.

``prolog``/``epilog`` are what the scripts in prolog/ and epilog/ call (Slurm sets
SLURMD_NODENAME and the job's variables); ``periodic`` is what healthcheck/ calls as
slurm.conf's HealthCheckProgram. ``check`` runs the same checks by hand and prints
a table without draining. ``resume`` returns a node to service only if slurmfabric drained it
and its checks pass again.
"""

from __future__ import annotations

import argparse
import json
import os

from slurmfabric.commands import health_history
from slurmfabric.commands._args import number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmfabric health",
        description="Node health checks, Slurm prolog/epilog hooks, drain and resume.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    config_help = ("site config (default: $SLURMFABRIC_HEALTH_CONFIG or "
                   "/etc/slurmfabric/health.toml)")
    for name, help_ in (("prolog", "run as Slurm Prolog= (drains and exits 1 on failure)"),
                        ("epilog", "run as Slurm Epilog= (drains and exits 1 on failure)"),
                        ("periodic", "run as Slurm HealthCheckProgram= on idle and allocated "
                         "nodes (drains by itself; no job checks)")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--config", help=config_help)
    p = sub.add_parser("check", help="run the checks now and print a table (never drains)")
    p.add_argument("--config", help=config_help)
    p.add_argument("--node", help="check as this node name (default: SLURMD_NODENAME or "
                   "the short hostname)")
    p.add_argument("--deep", action="store_true", help="also run the deep checks of a failed "
                   "job's epilog (PCIe speed strict, site commands)")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the JSON report instead")
    form.add_argument("--npd", action="store_true", help="Kubernetes node-problem-detector "
                      "custom plugin: one line of at most 80 characters, exit 0 healthy, 1 "
                      "a problem, 2 unknown (a config error)")
    form.add_argument("--condition", action="store_true", help="a Kubernetes NodeCondition "
                      "as JSON (type SlurmfabricHealthy), e.g. for a node label or patch")
    p = sub.add_parser("burn-in", help="the GPU stage of a burn-in: DCGM level 3 (or the "
                       "site's gpu_stress_argv), judged per GPU; never drains")
    p.add_argument("--config", help=config_help)
    p.add_argument("--results", help="directory to write gpu-<node>.json into (the pair "
                   "sweep's results directory)")
    p = sub.add_parser("resume", help="resume nodes slurmfabric drained once checks pass")
    p.add_argument("--config", help=config_help)
    p.add_argument("--node", help="node name or hostlist (default: this node)")
    p.add_argument("--no-check", action="store_true",
                   help="do not run the checks first (resume on the reason alone)")
    p.add_argument("--clear-lemon", action="store_true", help="also resume a lemon node "
                   "(drained lemon_drains times in lemon_window_h) and reset its drain count: "
                   "an admin's word that it was repaired")
    p = sub.add_parser("versions", help="compare the version inventories the hooks left in "
                       "versions_dir: print the nodes unlike the majority (exit 1 if any)")
    p.add_argument("paths", nargs="+", metavar="DIR-or-FILE",
                   help="the shared versions_dir, or <node>.json inventories")
    health_history.add_parser(sub)
    p = sub.add_parser("install-hooks", help="write the prolog, epilog and HealthCheckProgram "
                       "scripts with absolute paths")
    p.add_argument("dest", help="directory to write slurmfabric-prolog, slurmfabric-epilog "
                   "and slurmfabric-healthcheck")
    p.add_argument("--bin", default=None, help="absolute path of the slurmfabric executable "
                   "(default: the one running now)")
    p.add_argument("--config", help="bake this config path into the scripts")
    p.add_argument("--log", default=None, help="hook log for the wrappers' own fail-open "
                   "lines (default: the config's [runner] log_file)")
    p.add_argument("--prometheus", default=None, help="textfile whose .hook.prom the wrappers "
                   "set on a fail-open (default: the config's [runner] prometheus_file)")
    p.add_argument("--syslog-socket", default="/dev/log",
                   help="syslog socket for logger(1) (default /dev/log)")
    p.add_argument("--max-seconds", type=number(5, 3600, integer=True), default=50,
                   help="hard cap on one hook run; past it the hook fails open (default 50: "
                   "keep it below PrologEpilogTimeout and slurmd's 60 s HealthCheckProgram "
                   "kill)")
    return parser


def _check(args: argparse.Namespace) -> int:
    from slurmfabric.health import hooks, outputs

    node = args.node or hooks.node_name(os.environ)
    run = hooks.check(node, args.config, deep=args.deep)
    if args.npd or args.condition:
        line, condition = outputs.kubernetes_condition(run)
        print(line if args.npd else json.dumps(condition, indent=1))
        return 1 if run.blocking else 0
    if args.json:
        print(json.dumps(outputs.report_dict(run, exit_code=1 if run.blocking else 0),
                         indent=1, default=str))
    else:
        print(f"node {node}: {run.status.upper()} in {run.seconds:.3f} s")
        print(outputs.table(run.results))
    return 1 if run.blocking else 0


def _versions(args: argparse.Namespace) -> int:
    from slurmfabric.errors import UsageError
    from slurmfabric.health.checks import versions

    inventories = versions.load_inventories(args.paths)
    if not inventories:
        raise UsageError(f"no inventories in {' '.join(args.paths)}",
                         hint="set versions_dir in [[nodes]]; prologs write <node>.json there")
    odd = versions.drift(inventories)
    components = {c for v in inventories.values() for c in versions.flatten(v)}
    print(f"{len(inventories)} nodes, {len(components)} components, "
          f"{len({o.node for o in odd})} unlike the majority")
    if odd:
        rows = [("NODE", "COMPONENT", "VALUE", "MAJORITY")] + [
            (o.node, o.component, o.value or "-", f"{o.majority} ({o.count}/{o.total})")
            for o in odd]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[3])
    return 1 if odd else 0


def _resume(args: argparse.Namespace) -> int:
    from slurmfabric.health import drain, hooks, lemon, siteconfig
    from slurmfabric.slurm import cmd

    names = [args.node] if args.node else [hooks.node_name(os.environ)]
    if args.node and any(c in args.node for c in "[,"):
        from slurmfabric.slurm.hostlist import expand

        names = expand(args.node)
    failed = 0
    for node in names:
        cfg = siteconfig.load(node, args.config)
        record = cmd.node(node)
        reason = drain.current_reason(record)
        if not args.no_check and not _is_here(node):
            # The checks read this machine's GPUs and NICs: run under another node's name
            # they would judge the wrong hardware (and Slurm runs no job on a drained node).
            print(f"{node}: not checked here, left as is: run 'slurmfabric health resume' on "
                  f"{node} itself (e.g. pdsh -w {node} ...), or --no-check to resume on the "
                  "reason alone")
            failed += 1
            continue
        if not args.no_check:
            run = hooks.check(node, args.config)
            if run.blocking:
                why = "; ".join(f"{r.check}: {r.reason}" for r in run.blocking)
                print(f"{node}: checks still fail, left drained: {why}")
                failed += 1
                continue
        if lemon.is_lemon(reason) and not args.clear_lemon:
            print(f"{node}: a lemon node, left drained (reason: {reason}); after a repair, "
                  "resume it with --clear-lemon")
            failed += 1
            continue
        if drain.resume_if_ours(node, drain.DrainPolicy.from_site(cfg),
                                clear_lemon=args.clear_lemon):
            print(f"{node}: resumed (was: {reason})")
        elif reason:
            print(f"{node}: not drained by slurmfabric, left alone (reason: {reason})")
        else:
            print(f"{node}: not drained, nothing to do")
    return 1 if failed else 0


def _is_here(node: str) -> bool:
    """Is ``node`` this machine: its own Slurm name, or a name whose address is one of this
    host's (binding to it works only for a local address; the testbed's virtual nodes)?"""
    import socket

    from slurmfabric.health import hooks

    if node == hooks.node_name(os.environ):
        return True
    try:
        address = socket.gethostbyname(node)
        with socket.socket() as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def _install(args: argparse.Namespace) -> int:
    from slurmfabric.health import hookscript

    for path in hookscript.install_hooks(
            args.dest, bin=args.bin, config=args.config, log=args.log,
            prometheus=args.prometheus, syslog_socket=args.syslog_socket,
            max_seconds=args.max_seconds):
        print(path)
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action in ("prolog", "epilog", "periodic"):
        from slurmfabric.health.hooks import run_hook

        return run_hook(args.action, args.config)
    if args.action == "check":
        return _check(args)
    if args.action == "resume":
        return _resume(args)
    if args.action == "versions":
        return _versions(args)
    if args.action == "history":
        return health_history.run(args)
    if args.action == "burn-in":
        from slurmfabric.health import hooks

        node = hooks.node_name(os.environ)
        report, code = hooks.burn_in(node, args.config, args.results)
        print(f"node {node}: GPU burn-in {'FAILED' if code else 'passed'}"
              + (f": {report['reason']}" if report.get("reason") else ""))
        return code
    return _install(args)
