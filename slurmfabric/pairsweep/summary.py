"""``pairs report``: everything a sweep's results directory says, assembled once.

``report.py`` holds the rules (what is low, who is suspect); this module runs them in order
over one results directory (the sweep, its retests, rails, cables, drift from a baseline, the
GPU stage of a burn-in, how the rounds ran) and keeps the outcome in one typed report whose
``to_dict`` is the ``--json`` document. A k-batch sweep has its own, smaller report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from slurmfabric.errors import UsageError
from slurmfabric.pairsweep import report as rules
from slurmfabric.pairsweep.batch import BatchAnalysis, analyze_batches
from slurmfabric.pairsweep.judge import Judge
from slurmfabric.pairsweep.plan import Pair

MATRIX_JSON_MAX = 256  # nodes up to which --json carries the matrix ("pairs" always)


@dataclass
class SweepReport:
    """A pair sweep judged: the analysis after retests, rails, cables and the GPU stage."""

    plan: dict
    judge: Judge
    pairs: list[rules.PairResult]  # the sweep's and its retests', in order
    values: dict[Pair, float | None]  # each pair's last measurement
    failed: list[Pair]
    analysis: rules.Analysis
    recovered: list[Pair]  # low in the sweep, fine when retested
    slow_rails: list[str]
    cables: list = field(default_factory=list)  # paths.Cable
    drifted: list = field(default_factory=list)  # baseline.Drift
    gpu_stage: dict[str, str | None] = field(default_factory=dict)
    execution: list[str] = field(default_factory=list)
    overlap: dict[int, bool] = field(default_factory=dict)
    gate: list[str] = field(default_factory=list)  # lines of burnin.gate, when it ran
    versions: list[str] = field(default_factory=list)  # version_findings, with a versions_dir

    @property
    def nodes(self) -> list[str]:
        return self.plan["nodes"]

    @property
    def sweep_pairs(self) -> list[rules.PairResult]:
        """The sweep's own pairs, without the retests."""
        return [r for r in self.pairs if not r.retest]

    @property
    def failed_anything(self) -> bool:
        """What makes ``pairs report`` exit 1."""
        a = self.analysis
        return bool(a.suspect_nodes or a.suspect_links or a.unresolved or self.execution
                    or self.drifted or self.cables or a.slow_group)

    def svg(self) -> str:
        """The heatmap: the pair matrix, or per-node bars from ``heatmap.BARS_FROM`` nodes."""
        from slurmfabric.pairsweep.heatmap import BARS_FROM, render_bars, render_svg

        a = self.analysis
        if len(self.nodes) >= BARS_FROM:
            return render_bars(self.nodes, a.node_median, a.reference,
                               f"pair sweep: {len(self.nodes)} nodes, "
                               f"{len(self.sweep_pairs)} pairs", a.messages[:20],
                               set(a.suspect_nodes))
        return render_svg(self.nodes, rules.matrix(self.nodes, self.values), a.reference,
                          f"pair sweep: {len(self.pairs)} pairs, "
                          f"{len(self.plan['rounds'])} rounds",
                          a.messages, {frozenset(p) for p in self.failed})

    def markdown(self) -> str:
        text = rules.render_markdown(self.nodes, self.values, self.analysis,
                                     [d.message() for d in self.drifted], self.recovered,
                                     len(self.pairs) - len(self.sweep_pairs))
        if not self.versions:
            return text
        return text.rstrip("\n") + "\n\n## Versions\n\n" + "".join(
            f"- {line}\n" for line in self.versions)

    def text(self) -> str:
        """The terminal report: the matrix (or per-node table), then drift, how the rounds
        ran, the pairs the retests cleared and what the gate did."""
        lines = [rules.render_table(self.nodes, self.values, self.analysis)]
        lines += [f"drift: {item.message()}" for item in self.drifted]
        lines += [f"versions: {line}" for line in self.versions]
        lines += [f"! {problem}" for problem in self.execution]
        lines += [f"note: the pairs of round {rnd} did not overlap in time"
                  for rnd, ran_together in self.overlap.items() if not ran_together]
        lines += [f"note: pair {a}+{b} was low at first and fine when retested: not a "
                  "suspect" for a, b in self.recovered]
        return "\n".join(lines + self.gate)

    def to_dict(self) -> dict:
        a = self.analysis
        big = len(self.nodes) > MATRIX_JSON_MAX  # N x N cells: 67 million at 8,192 nodes
        return {
            "nodes": self.nodes, "rounds": [[list(p) for p in r] for r in self.plan["rounds"]],
            "matrix": None if big else rules.matrix(self.nodes, self.values),
            "reference": a.reference, "node_median": a.node_median,
            "pairs": [{"round": r.round, "pair": list(r.pair), "busbw": r.busbw, "rc": r.rc,
                       "ran_on": r.ran_on, "error": r.error, "rails": r.rails}
                      for r in self.sweep_pairs],
            "slow_rails": self.slow_rails,
            "retests": [{"pass": r.retest, "round": r.round, "pair": list(r.pair),
                         "busbw": r.busbw, "error": r.error} for r in self.pairs if r.retest],
            "recovered": [list(p) for p in self.recovered],
            "unresolved": [list(p) for p in a.unresolved], "judge": self.judge.to_dict(),
            "behind_cables": a.behind_cables,
            "cables": [{"cable": c.link.label, "node": c.access,
                        "explains": [list(p) for p in c.explains], "commands": c.commands()}
                       for c in self.cables],
            "drift": [{"kind": d.kind, "what": d.what, "now": d.now, "baseline": d.baseline,
                       "drop": round(d.drop, 4)} for d in self.drifted],
            "low_pairs": [list(p) for p in a.low_pairs],
            "suspect_nodes": a.suspect_nodes,
            "slow_group": a.slow_group,
            "suspect_links": [list(p) for p in a.suspect_links],
            "messages": a.messages, "execution_problems": self.execution,
            "rounds_concurrent": {str(k): v for k, v in self.overlap.items()},
            "gate": self.gate, "gpu_stage": self.gpu_stage, "versions": self.versions,
        }


def build(results: Path, judge: Judge, baseline: str | None = None, drift: float = 0.05,
          topology: str | None = None, node_map: str | None = None,
          versions_dir: str | None = None) -> SweepReport:
    """Judge a pair sweep's results directory: the latest measurement of each pair (a retest
    replaces the sweep's), what the sweep alone said (for the pairs its retests cleared), slow
    rails, the cables a ``topology`` blames, drift below a ``baseline`` file, the GPU stage,
    and the swept nodes' versions (the hooks' inventories in ``versions_dir``)."""
    plan, pairs = rules.load_results(results)
    nodes = plan["nodes"]
    values, failed = rules.latest(pairs)
    analysis = rules.analyze(nodes, values, judge.threshold, failed, judge.reference,
                             judge.expected)
    sweep = [r for r in pairs if not r.retest]
    first = analysis
    if len(sweep) < len(pairs):  # what the sweep alone said, before its retests
        sweep_values, sweep_failed = rules.latest(sweep)
        first = rules.analyze(nodes, sweep_values, judge.threshold, sweep_failed,
                              judge.reference, judge.expected)
    recovered = [p for p in first.flagged if p not in set(analysis.flagged)]
    rails = rules.slow_rails(pairs, analysis)
    analysis.messages.extend(rails)
    cables = _cables(topology, node_map, analysis, values) if topology else []
    analysis = rules.with_cables(analysis, cables)
    drifted = []
    if baseline:
        from slurmfabric.pairsweep import baseline as baseline_mod

        drifted = baseline_mod.drift(values, baseline_mod.read(baseline), drift)
    verdicts = rules.gpu_stage(results, plan)
    analysis = rules.with_gpu_stage(analysis, verdicts)
    return SweepReport(
        plan=plan, judge=judge, pairs=pairs, values=values, failed=failed,
        analysis=analysis, recovered=recovered,
        slow_rails=rails, cables=cables, drifted=drifted, gpu_stage=verdicts,
        execution=rules.check_execution(plan, sweep), overlap=rules.round_overlap(sweep),
        versions=version_findings(nodes, analysis, versions_dir) if versions_dir else [])


def version_findings(nodes: list[str], analysis: rules.Analysis,
                     versions_dir: str) -> list[str]:
    """The swept nodes' versions, from the inventories the health hooks leave in
    ``versions_dir`` (node.versions): a node unlike the sweep's majority, and a version the
    whole slow group shares and no other node has, the usual shared cause of a bimodal
    sweep (a driver, an HCA firmware, a VBIOS). Said, never judged: the sweep's verdict
    stays its bandwidth."""
    from slurmfabric.health.checks.versions import drift, flatten, load_inventories

    swept = set(nodes)
    inventories = {n: v for n, v in load_inventories([versions_dir]).items() if n in swept}
    if not inventories:
        return [f"no inventory of a swept node in {versions_dir} (the prolog writes "
                "<node>.json there when versions_dir is set)"]
    lines = [f"{o.node} {o.component} {o.value or 'not reported'} ({o.count}/{o.total} "
             f"swept nodes have {o.majority})" for o in drift(inventories)]
    slow = [n for n in analysis.slow_group if n in inventories]
    rest = [n for n in analysis.passing_nodes if n in inventories]
    if slow and rest:
        flat = {n: flatten(inventories[n]) for n in slow + rest}
        for component in sorted({c for values in flat.values() for c in values}):
            theirs = {flat[n].get(component) for n in slow}
            others = {flat[n].get(component) for n in rest}
            if len(theirs) == 1 and None not in theirs and not theirs & others:
                lines.append(f"the slow group ({len(slow)} nodes) shares {component} "
                             f"{next(iter(theirs))}; the other nodes have "
                             f"{', '.join(sorted(v or 'none' for v in others))}")
    missing = len(swept) - len(inventories)
    if missing:
        lines.append(f"{missing} of {len(swept)} swept nodes have no inventory in "
                     f"{versions_dir}")
    return lines


def _cables(topology: str, node_map: str | None, analysis: rules.Analysis,
            values: dict[Pair, float | None]) -> list:
    """The cables the topology puts on every path of a bad pair and on no good one."""
    from slurmfabric._common.inputfile import read_text
    from slurmfabric.ibaudit.names import load_namer
    from slurmfabric.ibaudit.parse import parse_ibnetdiscover
    from slurmfabric.pairsweep.paths import Fabric, shared_cables

    topo = parse_ibnetdiscover(read_text(topology, "ibnetdiscover topology"))
    fabric = Fabric.from_topology(topo, load_namer(node_map, None))
    unknown = sorted(n for n in analysis.nodes if n not in fabric.hcas)
    if len(unknown) == len(analysis.nodes):
        raise UsageError(f"--topology {topology}: none of the sweep's nodes is in it",
                         hint="HCA descriptions must start with the Slurm node name, or give "
                         "--node-map")
    bad = set(analysis.flagged)
    good = sorted(p for p, v in values.items() if v is not None and p not in bad)
    return shared_cables(fabric, sorted(bad), good)


@dataclass
class BatchReport:
    """A k-batch sweep judged: each group's bus bandwidth, the nodes it names, the pair
    sweep that resolves the rest."""

    results: Path
    plan: dict
    judge: Judge
    groups: list[rules.PairResult]
    analysis: BatchAnalysis
    follow_up: str | None  # the pair sweep to run next
    problems: list[str]

    @property
    def failed_anything(self) -> bool:
        a = self.analysis
        return bool(a.suspect_nodes or a.unresolved or a.unexplained or self.problems)

    def text(self) -> str:
        """Each group's bus bandwidth, the findings and the pair sweep to run next."""
        a, plan = self.analysis, self.plan
        ref = f"{a.reference:.1f} GB/s" if a.reference else "none"
        lines = [f"k-batch sweep: {len(plan['nodes'])} nodes, {len(self.groups)} groups in "
                 f"{len(plan['rounds'])} rounds; reference {ref}, bar "
                 f"{100 * a.threshold:.0f} %"]
        for g in self.groups:
            value = f"{g.busbw:8.1f}" if g.busbw is not None else "  failed"
            lines.append(f"  round {g.round} {value}  {','.join(g.pair)}"
                         + (f"  ({g.error})" if g.error else ""))
        lines += a.messages + [f"! {p}" for p in self.problems]
        if self.follow_up:
            lines.append(f"next: {self.follow_up}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        a = self.analysis
        return {
            "pattern": "k-batch", "nodes": self.plan["nodes"], "reference": a.reference,
            "judge": self.judge.to_dict(),
            "groups": [{"round": g.round, "nodes": list(g.pair), "busbw": g.busbw,
                        "rc": g.rc, "error": g.error} for g in self.groups],
            "suspect_nodes": a.suspect_nodes, "unresolved": a.unresolved,
            "unexplained": [{"round": r, "nodes": list(g)} for r, g in a.unexplained],
            "messages": a.messages, "follow_up": self.follow_up,
            "execution_problems": self.problems,
        }


def build_batch(results: Path, judge: Judge) -> BatchReport:
    plan, groups = rules.load_groups(results)
    analysis = analyze_batches([(g.round, g.pair, g.busbw if g.ok else None) for g in groups],
                               judge.threshold, judge.reference, judge.expected)
    problems = [f"round {g.round} group {'+'.join(g.pair)}: {g.error}" for g in groups
                if g.error and g.busbw is not None]
    problems += [f"round {g.round}: group {'+'.join(g.pair)} ran on "
                 f"{','.join(sorted(set(g.ran_on)))}" for g in groups
                 if g.ran_on and sorted(set(g.ran_on)) != sorted(g.pair)]
    return BatchReport(results=results, plan=plan, judge=judge, groups=groups,
                       analysis=analysis, follow_up=analysis.follow_up(plan["nodes"],
                                                                        str(results)),
                       problems=problems)


def retest_plan(results: Path, pass_: int) -> list[list[Pair]]:
    """The rounds of retest pass ``pass_``, judged on everything measured before it as the
    sweep was submitted; empty when nothing is left to retest (the job then stops)."""
    from slurmfabric.pairsweep.judge import resolve
    from slurmfabric.pairsweep.plan import schedule_pairs

    plan, pairs = rules.load_results(results)
    pairs = [r for r in pairs if r.retest < pass_]
    judge = resolve(saved=plan.get("judge"))
    values, failed = rules.latest(pairs)
    analysis = rules.analyze(plan["nodes"], values, judge.threshold, failed, judge.reference,
                             judge.expected)
    measured: dict[frozenset, int] = {}
    for res in pairs:
        measured[frozenset(res.pair)] = measured.get(frozenset(res.pair), 0) + 1
    return schedule_pairs(rules.retest_pairs(analysis, 2, measured))
