"""``slurmfabric pairs submit|report|schedule``: the node-pair bandwidth sweep."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from slurmfabric._common.textcheck import split_args
from slurmfabric.commands._args import number
from slurmfabric.errors import UsageError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurmfabric pairs",
        description="Test every node pair in rounds (each node once per round) and name the "
        "node or link that is slow.",
    )
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("submit", help="render the sweep job and submit it with sbatch")
    s.add_argument("--nodes", required=True, help="hostlist, e.g. gpu[001-016]")
    s.add_argument("--pairs", help="only these pairs: a:b,c:d (default: every pair)")
    s.add_argument("--results", required=True,
                   help="absolute results directory on a filesystem all nodes share")
    s.add_argument("--command", help="bandwidth command run on each pair (default: "
                   "all_reduce_perf -b 1G -e 8G -f 2 -g 1)")
    s.add_argument("--pattern", choices=("round-robin", "topology", "k-batch"),
                   default="round-robin",
                   help="round-robin: every pair (N-1 rounds); topology: pairs chosen by "
                   "distance in the --topology fabric, a few rounds per distance; k-batch: "
                   "groups of --batch nodes all at once, two rounds (a screen for large "
                   "clusters; its report prints the pair sweep for what it cannot resolve)")
    s.add_argument("--batch", type=number(2, 4096, integer=True), metavar="K",
                   help="--pattern k-batch: nodes per group")
    s.add_argument("--topology", metavar="FILE", help="ibnetdiscover output (--pattern "
                   "topology)")
    s.add_argument("--node-map", metavar="FILE", help="node-name-map for --topology")
    s.add_argument("--hops", default="2,4,6", help="--pattern topology: distances in cables "
                   "(2: one leaf switch, 4: through a spine, 6: through a core)")
    s.add_argument("--test", choices=("nccl-tests", "ib_write_bw", "ib_read_bw", "ib_send_bw"),
                   default="nccl-tests", help="nccl-tests (--command) or a perftest tool run "
                   "once per rail, all rails at once, so one bad rail is named")
    s.add_argument("--rails", help="with a perftest --test: the HCAs, e.g. "
                   "mlx5_0,mlx5_1,... (in GPU order for --cuda)")
    s.add_argument("--cuda", action="store_true", help="GPUDirect: rail i uses GPU i "
                   "(--use_cuda=i)")
    s.add_argument("--perftest-arg", action="append", default=[],
                   help="extra argument for the perftest tool (e.g. --perftest-arg=-s "
                   "--perftest-arg=8388608)")
    s.add_argument("--partition")
    s.add_argument("--time", dest="time_limit", help="job time limit")
    s.add_argument("--tasks-per-node", type=number(1, 1024, integer=True),
                   default=1, help="ranks per node (GPUs)")
    s.add_argument("--gpus-per-node", type=number(0, 1024, integer=True))
    s.add_argument("--mpi", help="srun --mpi plugin for MPI builds of nccl-tests (e.g. pmix)")
    s.add_argument("--srun-arg", action="append", default=[], help="extra srun argument")
    s.add_argument("--sbatch-arg", action="append", default=[], help="extra #SBATCH argument")
    s.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    s.add_argument("--burn-in", metavar="RESERVATION",
                   help="burn-in gate: run in this maintenance reservation (it keeps user jobs "
                   "off); nodes slurmfabric drained are resumed into it first (Slurm runs no "
                   "job on a drained node) and remembered; nodes someone else drained refuse")
    s.add_argument("--gpu-stage", action="store_true",
                   help="burn-in gate: first run 'slurmfabric health burn-in' on every node "
                   "(DCGM level 3, or the site's gpu_stress_argv); 'pairs report' then "
                   "counts a node as passing only if its GPUs and its links pass")
    s.add_argument("--retests", type=number(0, 10, integer=True), default=2,
                   help="retest passes in the same job for pairs still below the bar, each "
                   "suspect node also paired with good ones (default 2; 0: none; k-batch runs "
                   "none: its report prints the pair sweep to run)")
    _judge_options(s, "used by the retests and by 'pairs report'")
    s.add_argument("--state-dir", help="drain state directory (as for 'pairs report')")
    s.add_argument("--health-config", metavar="FILE", help="site health config whose [runner] "
                   "drain policy applies (default: $SLURMFABRIC_HEALTH_CONFIG or "
                   "/etc/slurmfabric/health.toml)")
    r = sub.add_parser("report", help="matrix, outliers and suspects from a results directory")
    r.add_argument("results")
    r.add_argument("--json", action="store_true")
    r.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    r.add_argument("--baseline", metavar="FILE", help="flag nodes and pairs that drifted "
                   "below this baseline ('pairs baseline')")
    r.add_argument("--topology", metavar="FILE", help="ibnetdiscover output of the fabric: "
                   "name the cables the bad pairs share and no good pair uses")
    r.add_argument("--node-map", metavar="FILE", help="node-name-map (GUID \"name\") for "
                   "--topology, as for 'ib audit'")
    r.add_argument("--drift", type=number(0, 1, low_open=True), default=0.05,
                   help="drift that counts, as a fraction of the baseline (default 0.05)")
    r.add_argument("--svg", help="write an SVG heatmap here")
    _judge_options(r, "default: as the sweep was submitted")
    r.add_argument("--drain", action="store_true",
                   help="drain suspect nodes (reason 'slurmfabric: pairs: ...')")
    r.add_argument("--resume-passing", action="store_true",
                   help="burn-in gate: resume nodes that pass, only if slurmfabric drained them")
    r.add_argument("--state-dir", help="drain state directory (default: the site config's)")
    r.add_argument("--health-config", metavar="FILE", help="site health config whose [runner] "
                   "drain policy applies (default: $SLURMFABRIC_HEALTH_CONFIG or "
                   "/etc/slurmfabric/health.toml)")
    b = sub.add_parser("baseline", help="build a baseline (per node and pair: median, min, "
                       "max) from known-good sweeps, for 'pairs report --baseline'")
    b.add_argument("results", nargs="+", help="results directories of one or more sweeps")
    b.add_argument("-o", "--output", required=True, help="baseline file to write (JSON)")
    t = sub.add_parser("retest-plan", help="print the next retest pass's pairs (the sweep "
                       "job runs this between passes): 'ROUND NODE NODE' lines")
    t.add_argument("results")
    t.add_argument("--pass", dest="pass_", type=number(1, 10, integer=True), required=True,
                   help="the pass about to run (1 after the sweep's own rounds)")
    d = sub.add_parser("rdma-step", help="one pair's per-rail perftest (what the sweep "
                       "job's steps run): servers on task 0, clients on task 1")
    d.add_argument("--rails", required=True)
    d.add_argument("--cuda", action="store_true")
    d.add_argument("tool", nargs=argparse.REMAINDER, help="-- ib_write_bw [options]")
    c = sub.add_parser("schedule", help="print the round-robin rounds for a node list")
    c.add_argument("--nodes", required=True)
    return p


def _judge_options(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--reference", choices=("median", "best"), default=None,
                   help="what a pair is judged against: the median of the node medians, or "
                   f"the best pair of the sweep (NVIDIA ClusterKit's rule); {default}, "
                   "else median")
    p.add_argument("--threshold", type=number(0, 1, low_open=True), default=None,
                   help="a pair is low below this fraction of the reference (0.8 of the "
                   "median, 0.93 of the best)")
    p.add_argument("--expected", type=number(0, 100000, low_open=True), metavar="GBPS",
                   help="judge against this bus bandwidth instead (GB/s)")
    p.add_argument("--expected-from", metavar="topo|FILE", help="judge against what the "
                   "nodes' rails should carry (the whatif model): 'topo' for this node's, or "
                   "a compute node's 'slurmfabric topo snapshot' JSON")


def _judge(args: argparse.Namespace, saved: dict | None = None) -> dict:
    """The options given now, else the sweep's (plan.json), else the defaults."""
    saved = saved or {}
    reference = args.reference or saved.get("reference") or "median"
    if getattr(args, "expected_from", None):
        if args.expected is not None:
            raise UsageError("give --expected or --expected-from, not both")
        args.expected = _expected_from(args.expected_from)
    expected = args.expected if args.expected is not None else saved.get("expected")
    threshold = args.threshold if args.threshold is not None else saved.get("threshold")
    if threshold is None:
        threshold = 0.93 if reference == "best" and expected is None else 0.8
    return {"reference": reference, "threshold": float(threshold),
            "expected": None if expected is None else float(expected)}


def _expected_from(spec: str) -> float:
    """The pair bandwidth the rails should give, from the whatif model (slurmfabric/whatif/model.py)
    for this node's rails ('topo') or a compute node's topology snapshot."""
    from slurmfabric.nccl.tests import discover_fabric
    from slurmfabric.whatif import model as whatif

    topo = None
    if spec != "topo":
        from slurmfabric.topology import snapshot

        topo = snapshot.load(spec)
    rates, names, fabric = discover_fabric(None, topo)
    if not rates:
        raise UsageError(f"--expected-from {spec}: no rail NIC found (slurmfabric topo "
                         "--explain says why)", hint="give --expected GBPS instead")
    expected = whatif.nic_bound_busbw(rates, fabric)
    print(f"expected {expected:.1f} GB/s: {len(rates)} {fabric} rails of {max(rates):g} Gb/s "
          f"({', '.join(names[:4])}{' ...' if len(names) > 4 else ''}), the whatif model",
          file=sys.stderr)
    return expected


def _nodes(expr: str) -> list[str]:
    from slurmfabric.slurm.hostlist import expand

    return expand(expr)


def _plan(args: argparse.Namespace):
    from slurmfabric.pairsweep.plan import (
        DEFAULT_COMMAND,
        SweepPlan,
        parse_pairs,
        round_robin,
        schedule_pairs,
    )

    nodes = _nodes(args.nodes)
    if args.pairs:
        chosen = parse_pairs(args.pairs)
        unknown = sorted({n for p in chosen for n in p} - set(nodes))
        if unknown:
            raise UsageError(f"--pairs names nodes not in --nodes: {', '.join(unknown)}")
        rounds = schedule_pairs(chosen)
    elif args.pattern == "topology":
        rounds = _topology_rounds(args, nodes)
    elif args.pattern == "k-batch":
        rounds = _batch_rounds(args, nodes)
    else:
        rounds = round_robin(nodes)
    command = split_args(args.command, "--command") if args.command else list(DEFAULT_COMMAND)
    if not command or not command[0] or command[0].startswith("-"):
        from slurmfabric._common.textcheck import one_line

        raise UsageError(f"--command {one_line(repr(args.command), 120)}: no program first "
                         "(empty, or a leading '-' that the task's exec would read as an "
                         "option)", hint="give the program first, e.g. --command "
                         "'all_reduce_perf -b 1G -e 8G'")
    if args.test != "nccl-tests":
        command = _rdma_command(args)
    return SweepPlan(
        nodes=nodes, rounds=rounds, results=Path(args.results), command=command,
        partition=args.partition, time_limit=args.time_limit,
        tasks_per_node=args.tasks_per_node, gpus_per_node=args.gpus_per_node, mpi=args.mpi,
        srun_args=args.srun_arg, sbatch_args=args.sbatch_arg,
        retests=0 if args.pattern == "k-batch" else args.retests,
        judge=_judge(args), test=args.test, pattern=args.pattern,
    )


def _batch_rounds(args: argparse.Namespace, nodes: list[str]) -> list:
    from slurmfabric.pairsweep.batch import batch_rounds

    if args.batch is None:
        raise UsageError("--pattern k-batch needs --batch K", hint="e.g. --batch 4: groups "
                         "of 4 nodes")
    if args.pairs:
        raise UsageError("--pairs chooses pairs; --pattern k-batch chooses groups: give one")
    if args.test != "nccl-tests":
        raise UsageError(f"--test {args.test} runs between two nodes; --pattern k-batch "
                         "runs nccl-tests on groups", hint="use --pattern round-robin")
    return batch_rounds(nodes, args.batch)


def _topology_rounds(args: argparse.Namespace, nodes: list[str]) -> list:
    from slurmfabric._common.inputfile import read_text
    from slurmfabric.ibaudit.names import load_namer
    from slurmfabric.ibaudit.parse import parse_ibnetdiscover
    from slurmfabric.pairsweep.paths import Fabric, topology_rounds

    if not args.topology:
        raise UsageError("--pattern topology needs --topology FILE (ibnetdiscover output)")
    try:
        hops = [int(h) for h in args.hops.split(",") if h.strip()]
    except ValueError:
        raise UsageError(f"--hops {args.hops!r}: give even cable counts like 2,4,6") from None
    if not hops or any(h < 2 or h > 64 for h in hops):
        raise UsageError(f"--hops {args.hops!r}: give cable counts from 2 to 64, like 2,4,6")
    fabric = Fabric.from_topology(parse_ibnetdiscover(read_text(args.topology,
                                                                 "ibnetdiscover topology")),
                                  load_namer(args.node_map, None))
    missing = [n for n in nodes if n not in fabric.hcas]
    if missing:
        raise UsageError(f"--topology {args.topology}: no HCA of {', '.join(missing[:5])}",
                         hint="HCA descriptions must start with the Slurm node name, or give "
                         "--node-map")
    rounds = topology_rounds(fabric, nodes, hops)
    if not rounds:
        raise UsageError(f"--hops {args.hops}: no two nodes are that far apart in the fabric")
    return rounds


def _rdma_command(args: argparse.Namespace) -> list[str]:
    """The step of a per-rail perftest pair: 'pairs rdma-step' on both tasks."""
    from slurmfabric._common.executable import this_executable

    if not args.rails:
        raise UsageError(f"--test {args.test} needs --rails", hint="e.g. --rails "
                         "mlx5_0,mlx5_1,mlx5_2,mlx5_3 (the HCAs to test, in GPU order)")
    if args.command:
        raise UsageError(f"--command is for nccl-tests; --test {args.test} runs perftest",
                         hint="give perftest options with --perftest-arg")
    if args.tasks_per_node != 1:
        raise UsageError(f"--test {args.test} runs one task per node (the server and the "
                         "client), not --tasks-per-node")
    rails = [r for r in args.rails.split(",") if r]
    for rail in rails:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}(?::[0-9]{1,3})?", rail):
            raise UsageError(f"--rails: {rail!r} is not an HCA name like mlx5_0 or mlx5_0:1")
    argv = [this_executable(), "pairs", "rdma-step", "--rails", ",".join(rails)]
    if args.cuda:
        argv.append("--cuda")
    return [*argv, "--", args.test, "--report_gbits", *args.perftest_arg]


def _submit(args: argparse.Namespace) -> int:
    from slurmfabric._common.executable import this_executable
    from slurmfabric.job import submit
    from slurmfabric.pairsweep.plan import render_script, write_plan

    plan = _plan(args)
    plan.retest_cmd = [this_executable()]
    if args.burn_in:
        plan.sbatch_args.append(f"--reservation={args.burn_in}")
    if args.gpu_stage:
        plan.gpu_stage = [this_executable(), "health", "burn-in", "--results",
                          str(plan.results)]
        if args.health_config:
            plan.gpu_stage += ["--config", str(Path(args.health_config).resolve())]
    # One way to submit: the same request (and dry run) as every rendered job (submit.py).
    request = submit.SubmitRequest(script=render_script(plan), backend="sbatch",
                                   workdir=str(plan.results))
    if args.dry_run:
        print(request.describe(), end="")
        return 0
    if args.burn_in:
        _release_for_burnin(plan.nodes, args.burn_in, _policy(args))
    write_plan(plan)
    (plan.results / "sweep.sbatch").write_text(request.script)
    job_id = submit.submit(request)
    print(f"submitted job {job_id}: {len(plan.pairs)} pairs in {len(plan.rounds)} rounds; "
          f"then run: slurmfabric pairs report {plan.results}")
    return 0


def _policy(args: argparse.Namespace):
    """The site's drain policy, read before anything changes; --state-dir wins."""
    import socket

    from slurmfabric.health.drain import DrainPolicy

    return DrainPolicy.load(socket.gethostname().split(".")[0], args.health_config,
                            args.state_dir)


def _release_for_burnin(nodes: list[str], reservation: str, policy) -> None:
    """Resume the nodes slurmfabric drained into the maintenance reservation; refuse (before
    changing anything) when a node carries someone else's drain reason."""
    from slurmfabric.errors import SlurmCommandError
    from slurmfabric.health import drain as drain_mod
    from slurmfabric.slurm import cmd as slurmcmd

    try:
        slurmcmd.show("reservation", reservation)
    except SlurmCommandError as exc:
        raise UsageError(f"--burn-in {reservation}: no such reservation ({exc})", hint=(
            f"create it first, e.g. scontrol create reservation ReservationName={reservation} "
            "Nodes=... Users=root StartTime=now Duration=120 Flags=MAINT,IGNORE_JOBS")) from exc
    foreign = drain_mod.burnin_refusals(nodes, policy)
    if foreign:
        raise UsageError(
            f"--burn-in: drained by someone else, left alone: {', '.join(foreign)}",
            hint="Slurm runs no job on a drained node: leave these out of --nodes, or resume "
            "them yourself if they are ready to test")
    for node in nodes:
        out, reason = drain_mod.release_for_burnin(node, policy)
        if out == drain_mod.RELEASED:
            print(f"burn-in {node}: resumed into reservation {reservation} (was: {reason})")


def _gate(args, analysis) -> list[str]:
    """Drain suspects / resume passing nodes through the health module's rules. A node in
    burn-in (released by 'pairs submit --burn-in') is drained again if it fails, and its
    record ends if it passes (it is already running jobs)."""
    from slurmfabric.health import drain as drain_mod

    policy = _policy(args)
    lines = []
    for node in analysis.suspect_nodes:
        if args.drain or (args.resume_passing and drain_mod.in_burnin(node, policy.state_dir)):
            detail = next((m for m in analysis.messages if f" {node} " in f" {m} "), "slow")
            out = drain_mod.drain(node, "pairs", detail, policy)
            lines.append(f"drain {node}: {out.outcome} {out.detail}".rstrip())
    if args.resume_passing:
        for node in analysis.passing_nodes:
            if drain_mod.resume_if_ours(node, policy):
                lines.append(f"resume {node}: resumed")
            elif drain_mod.finish_burnin(node, policy.state_dir):
                lines.append(f"resume {node}: passed burn-in, back in service "
                             "(delete the reservation to open it to users)")
            else:
                lines.append(f"resume {node}: left as is")
    return lines


MATRIX_JSON_MAX = 256  # nodes up to which --json carries the matrix ("pairs" always)


def _report(args: argparse.Namespace) -> int:
    from slurmfabric.pairsweep.heatmap import BARS_FROM, render_bars, render_svg
    from slurmfabric.pairsweep.plan import read_plan
    from slurmfabric.pairsweep.report import (
        analyze,
        check_execution,
        gpu_stage,
        latest,
        load_results,
        matrix,
        render_markdown,
        render_table,
        round_overlap,
        slow_rails,
        with_cables,
        with_gpu_stage,
    )

    results = Path(args.results)
    if read_plan(results).get("pattern") == "k-batch":
        return _report_batch(args, results)
    plan, pairs = load_results(results)
    nodes = plan["nodes"]
    values, failed = latest(pairs)
    judge = _judge(args, plan.get("judge"))
    analysis = analyze(nodes, values, judge["threshold"], failed, judge["reference"],
                       judge["expected"])
    pairs_sweep = [r for r in pairs if not r.retest]
    first = analysis
    if len(pairs_sweep) < len(pairs):  # what the sweep alone said, before its retests
        sweep_values, sweep_failed = latest(pairs_sweep)
        first = analyze(nodes, sweep_values, judge["threshold"], sweep_failed,
                        judge["reference"], judge["expected"])
    recovered = [p for p in first.flagged if p not in set(analysis.flagged)]
    rails = slow_rails(pairs, analysis)
    analysis.messages.extend(rails)
    cables = _cables(args, analysis, values) if args.topology else []
    analysis = with_cables(analysis, cables)
    drifted = []
    if args.baseline:
        from slurmfabric.pairsweep import baseline as baseline_mod

        drifted = baseline_mod.drift(values, baseline_mod.read(args.baseline), args.drift)
    verdicts = gpu_stage(results, plan)
    analysis = with_gpu_stage(analysis, verdicts)
    execution = check_execution(plan, pairs_sweep)
    overlap = round_overlap(pairs_sweep)
    gate = _gate(args, analysis) if (args.drain or args.resume_passing) else []
    big = len(nodes) > MATRIX_JSON_MAX  # N x N cells: 67 million at 8,192 nodes
    if args.svg and len(nodes) >= BARS_FROM:
        Path(args.svg).write_text(render_bars(
            nodes, analysis.node_median, analysis.reference,
            f"pair sweep: {len(nodes)} nodes, {len(pairs_sweep)} pairs", analysis.messages[:20],
            set(analysis.suspect_nodes)))
    elif args.svg:
        Path(args.svg).write_text(render_svg(
            nodes, matrix(nodes, values), analysis.reference,
            f"pair sweep: {len(pairs)} pairs, {len(plan['rounds'])} rounds",
            analysis.messages, {frozenset(p) for p in failed}))
    if args.json:
        print(json.dumps({
            "nodes": nodes, "rounds": [[list(p) for p in r] for r in plan["rounds"]],
            "matrix": None if big else matrix(nodes, values), "reference": analysis.reference,
            "node_median": analysis.node_median,
            "pairs": [{"round": r.round, "pair": list(r.pair), "busbw": r.busbw, "rc": r.rc,
                       "ran_on": r.ran_on, "error": r.error, "rails": r.rails}
                      for r in pairs_sweep],
            "slow_rails": rails,
            "retests": [{"pass": r.retest, "round": r.round, "pair": list(r.pair),
                         "busbw": r.busbw, "error": r.error} for r in pairs if r.retest],
            "recovered": [list(p) for p in recovered],
            "unresolved": [list(p) for p in analysis.unresolved], "judge": judge,
            "behind_cables": analysis.behind_cables,
            "cables": [{"cable": c.link.label, "node": c.access,
                        "explains": [list(p) for p in c.explains], "commands": c.commands()}
                       for c in cables],
            "drift": [{"kind": d.kind, "what": d.what, "now": d.now, "baseline": d.baseline,
                       "drop": round(d.drop, 4)} for d in drifted],
            "low_pairs": [list(p) for p in analysis.low_pairs],
            "suspect_nodes": analysis.suspect_nodes,
            "slow_group": analysis.slow_group,
            "suspect_links": [list(p) for p in analysis.suspect_links],
            "messages": analysis.messages, "execution_problems": execution,
            "rounds_concurrent": {str(k): v for k, v in overlap.items()}, "gate": gate,
            "gpu_stage": verdicts,
        }, indent=2))
    elif args.markdown:
        print(render_markdown(nodes, values, analysis, [d.message() for d in drifted],
                              recovered, len(pairs) - len(pairs_sweep)))
    else:
        print(render_table(nodes, values, analysis))
        for item in drifted:
            print(f"drift: {item.message()}")
        for problem in execution:
            print(f"! {problem}")
        for rnd, ran_together in overlap.items():
            if not ran_together:
                print(f"note: the pairs of round {rnd} did not overlap in time")
        for a, b in recovered:
            print(f"note: pair {a}+{b} was low at first and fine when retested: not a suspect")
        for line in gate:
            print(line)
    bad = (analysis.suspect_nodes or analysis.suspect_links or analysis.unresolved or execution
           or drifted or cables or analysis.slow_group)
    return 1 if bad else 0


def _report_batch(args: argparse.Namespace, results: Path) -> int:
    """A k-batch sweep: each group's bus bandwidth, the nodes it names, the pair sweep
    that resolves the rest."""
    from slurmfabric.pairsweep.batch import analyze_batches
    from slurmfabric.pairsweep.report import load_groups

    for option in ("baseline", "topology", "svg", "drain", "resume_passing"):
        if getattr(args, option):
            raise UsageError(f"--{option.replace('_', '-')} is for pair sweeps; this is a "
                             "k-batch sweep", hint="run the pair sweep its report prints")
    plan, groups = load_groups(results)
    judge = _judge(args, plan.get("judge"))
    analysis = analyze_batches([(g.round, g.pair, g.busbw if g.ok else None) for g in groups],
                               judge["threshold"], judge["reference"], judge["expected"])
    follow = analysis.follow_up(plan["nodes"], str(results))
    problems = [f"round {g.round} group {'+'.join(g.pair)}: {g.error}" for g in groups
                if g.error and g.busbw is not None]
    problems += [f"round {g.round}: group {'+'.join(g.pair)} ran on "
                 f"{','.join(sorted(set(g.ran_on)))}" for g in groups
                 if g.ran_on and sorted(set(g.ran_on)) != sorted(g.pair)]
    if args.json:
        print(json.dumps({
            "pattern": "k-batch", "nodes": plan["nodes"], "reference": analysis.reference,
            "judge": judge,
            "groups": [{"round": g.round, "nodes": list(g.pair), "busbw": g.busbw,
                        "rc": g.rc, "error": g.error} for g in groups],
            "suspect_nodes": analysis.suspect_nodes, "unresolved": analysis.unresolved,
            "unexplained": [{"round": r, "nodes": list(g)} for r, g in analysis.unexplained],
            "messages": analysis.messages, "follow_up": follow,
            "execution_problems": problems,
        }, indent=2))
    else:
        ref = f"{analysis.reference:.1f} GB/s" if analysis.reference else "none"
        print(f"k-batch sweep: {len(plan['nodes'])} nodes, {len(groups)} groups in "
              f"{len(plan['rounds'])} rounds; reference {ref}, bar "
              f"{100 * analysis.threshold:.0f} %")
        for g in groups:
            value = f"{g.busbw:8.1f}" if g.busbw is not None else "  failed"
            print(f"  round {g.round} {value}  {','.join(g.pair)}"
                  + (f"  ({g.error})" if g.error else ""))
        for line in analysis.messages + [f"! {p}" for p in problems]:
            print(line)
        if follow:
            print(f"next: {follow}")
    bad = analysis.suspect_nodes or analysis.unresolved or analysis.unexplained or problems
    return 1 if bad else 0


def _cables(args: argparse.Namespace, analysis, values) -> list:
    """The cables the topology puts on every path of a bad pair and on no good one."""
    from slurmfabric._common.inputfile import read_text
    from slurmfabric.ibaudit.names import load_namer
    from slurmfabric.ibaudit.parse import parse_ibnetdiscover
    from slurmfabric.pairsweep.paths import Fabric, shared_cables

    topo = parse_ibnetdiscover(read_text(args.topology, "ibnetdiscover topology"))
    fabric = Fabric.from_topology(topo, load_namer(args.node_map, None))
    unknown = sorted(n for n in analysis.nodes if n not in fabric.hcas)
    if len(unknown) == len(analysis.nodes):
        raise UsageError(f"--topology {args.topology}: none of the sweep's nodes is in it",
                         hint="HCA descriptions must start with the Slurm node name, or give "
                         "--node-map")
    bad = set(analysis.flagged)
    good = sorted(p for p, v in values.items() if v is not None and p not in bad)
    return shared_cables(fabric, sorted(bad), good)


def _baseline(args: argparse.Namespace) -> int:
    from slurmfabric.pairsweep import baseline as baseline_mod
    from slurmfabric.pairsweep.report import latest, load_results

    sweeps = []
    for results in args.results:
        _, pairs = load_results(Path(results))
        sweeps.append((str(Path(results).resolve()), latest(pairs)[0]))
    data = baseline_mod.build(sweeps)
    baseline_mod.write(Path(args.output), data)
    print(f"{args.output}: {len(data['nodes'])} nodes, {len(data['pairs'])} pairs from "
          f"{len(sweeps)} sweep(s)")
    return 0


def _retest_plan(args: argparse.Namespace) -> int:
    """The pairs of retest pass K, judged on everything measured so far; prints nothing
    when nothing is left to retest (the job then stops retesting)."""
    from slurmfabric.pairsweep.plan import schedule_pairs
    from slurmfabric.pairsweep.report import analyze, latest, load_results, retest_pairs

    plan, pairs = load_results(Path(args.results))
    pairs = [r for r in pairs if r.retest < args.pass_]
    judge = _judge(argparse.Namespace(reference=None, threshold=None, expected=None),
                   plan.get("judge"))
    values, failed = latest(pairs)
    analysis = analyze(plan["nodes"], values, judge["threshold"], failed, judge["reference"],
                       judge["expected"])
    measured: dict[frozenset, int] = {}
    for res in pairs:
        measured[frozenset(res.pair)] = measured.get(frozenset(res.pair), 0) + 1
    for i, rnd in enumerate(schedule_pairs(retest_pairs(analysis, 2, measured)), 1):
        for a, b in rnd:
            print(f"{i:02d} {a} {b}")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.action == "submit":
        return _submit(args)
    if args.action == "report":
        return _report(args)
    if args.action == "retest-plan":
        return _retest_plan(args)
    if args.action == "baseline":
        return _baseline(args)
    if args.action == "rdma-step":
        from slurmfabric.pairsweep import rdmastep

        tool = args.tool[1:] if args.tool[:1] == ["--"] else args.tool
        if not tool:
            raise UsageError("rdma-step needs the tool after --, e.g. -- ib_write_bw")
        return rdmastep.run([r for r in args.rails.split(",") if r], tool, args.cuda)
    from slurmfabric.pairsweep.plan import round_robin

    for i, rnd in enumerate(round_robin(_nodes(args.nodes)), 1):
        print(f"round {i:2d}: " + "  ".join(f"{a}+{b}" for a, b in rnd))
    return 0
