"""``slurmfabric pairs submit|report|schedule``: the node-pair bandwidth sweep."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from slurmfabric.commands._args import number
from slurmfabric.errors import UsageError


def build_parser() -> argparse.ArgumentParser:
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
    r.add_argument("--versions", metavar="DIR", help="the health hooks' versions_dir: name "
                   "swept nodes unlike the majority and a version the slow group shares")
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


def _judge(args: argparse.Namespace, saved: dict | None = None):
    """The options given now, else the sweep's (plan.json), else the defaults."""
    from slurmfabric.pairsweep import judge

    expected = args.expected
    if getattr(args, "expected_from", None):
        if expected is not None:
            raise UsageError("give --expected or --expected-from, not both")
        expected, why = judge.expected_from(args.expected_from)
        print(why, file=sys.stderr)
    return judge.resolve(args.reference, args.threshold, expected, saved)


def _nodes(expr: str) -> list[str]:
    from slurmfabric.slurm.hostlist import expand

    return expand(expr)


def _submit(args: argparse.Namespace) -> int:
    from slurmfabric.job import submit
    from slurmfabric.pairsweep import burnin
    from slurmfabric.pairsweep.plan import render_script, write_plan
    from slurmfabric.pairsweep.sweepjob import make_plan

    plan = make_plan(
        nodes=_nodes(args.nodes), results=args.results, judge=_judge(args).to_dict(),
        pairs=args.pairs, pattern=args.pattern, batch=args.batch, topology=args.topology,
        node_map=args.node_map, hops=args.hops, command=args.command, test=args.test,
        rails=args.rails, cuda=args.cuda, perftest_args=args.perftest_arg,
        partition=args.partition, time_limit=args.time_limit,
        tasks_per_node=args.tasks_per_node, gpus_per_node=args.gpus_per_node, mpi=args.mpi,
        srun_args=args.srun_arg, sbatch_args=args.sbatch_arg, retests=args.retests,
        burn_in=args.burn_in, gpu_stage=args.gpu_stage, health_config=args.health_config)
    # One way to submit: the same request (and dry run) as every rendered job (submit.py).
    request = submit.SubmitRequest(script=render_script(plan), backend="sbatch",
                                   workdir=str(plan.results))
    if args.dry_run:
        print(request.describe(), end="")
        return 0
    if args.burn_in:
        policy = burnin.policy(args.health_config, args.state_dir)
        for node, reason in burnin.release(plan.nodes, args.burn_in, policy):
            print(f"burn-in {node}: resumed into reservation {args.burn_in} (was: {reason})")
    write_plan(plan)
    (plan.results / "sweep.sbatch").write_text(request.script)
    job_id = submit.submit(request)
    print(f"submitted job {job_id}: {len(plan.pairs)} pairs in {len(plan.rounds)} rounds; "
          f"then run: slurmfabric pairs report {plan.results}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from slurmfabric.pairsweep import burnin, summary
    from slurmfabric.pairsweep.plan import read_plan

    results = Path(args.results)
    saved = read_plan(results)
    if saved.get("pattern") == "k-batch":
        return _report_batch(args, results, saved)
    report = summary.build(results, _judge(args, saved.get("judge")), args.baseline,
                           args.drift, args.topology, args.node_map, args.versions)
    if args.drain or args.resume_passing:
        report.gate = burnin.gate(report.analysis,
                                  burnin.policy(args.health_config, args.state_dir),
                                  args.drain, args.resume_passing)
    if args.svg:
        Path(args.svg).write_text(report.svg())
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif args.markdown:
        print(report.markdown())
    else:
        print(report.text())
    return 1 if report.failed_anything else 0


def _report_batch(args: argparse.Namespace, results: Path, saved: dict) -> int:
    from slurmfabric.pairsweep import summary

    for option in ("baseline", "topology", "svg", "drain", "resume_passing", "versions"):
        if getattr(args, option):
            raise UsageError(f"--{option.replace('_', '-')} is for pair sweeps; this is a "
                             "k-batch sweep", hint="run the pair sweep its report prints")
    report = summary.build_batch(results, _judge(args, saved.get("judge")))
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.text())
    return 1 if report.failed_anything else 0


def _baseline(args: argparse.Namespace) -> int:
    from slurmfabric.pairsweep import baseline as baseline_mod

    data = baseline_mod.from_sweeps([Path(r) for r in args.results])
    baseline_mod.write(Path(args.output), data)
    print(f"{args.output}: {len(data['nodes'])} nodes, {len(data['pairs'])} pairs from "
          f"{len(data['sweeps'])} sweep(s)")
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "submit":
        return _submit(args)
    if args.action == "report":
        return _report(args)
    if args.action == "retest-plan":
        from slurmfabric.pairsweep.summary import retest_plan

        for i, rnd in enumerate(retest_plan(Path(args.results), args.pass_), 1):
            for a, b in rnd:
                print(f"{i:02d} {a} {b}")
        return 0
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
