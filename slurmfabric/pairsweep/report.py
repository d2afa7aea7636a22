"""Read a pair sweep's results, check how it ran, and name the node or link to suspect.

Robust rule (documented for operators): the reference is the median over nodes of each
node's median pair bandwidth, so one bad node cannot drag it down even when it touches
half the pairs (3 of 6 pairs with 4 nodes). A pair is low below ``threshold`` x reference
(default 0.8). A node whose own median is low is a suspect: its NIC, cable or switch port.
A low pair between two nodes that are fine with everyone else points at the path between
them. Failed pairs (no result, non-zero exit, #wrong > 0) are treated the same way.
Standard library only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from slurmfabric.nccltests import parse as parse_nccl_tests
from slurmfabric.pairsweep.plan import Pair, pair_base, read_plan


@dataclass
class PairResult:
    round: int
    pair: Pair
    busbw: float | None = None
    rc: int | None = None
    wrong: int = 0
    ran_on: list[str] = field(default_factory=list)  # nodes the tasks recorded
    start: float | None = None
    end: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.busbw is not None


@dataclass
class Analysis:
    nodes: list[str]
    reference: float | None
    threshold: float
    node_median: dict[str, float | None]
    low_pairs: list[Pair]
    failed_pairs: list[Pair]
    suspect_nodes: list[str]
    suspect_links: list[Pair]
    messages: list[str]

    @property
    def passing_nodes(self) -> list[str]:
        bad = set(self.suspect_nodes) | {n for p in self.suspect_links for n in p}
        return [n for n in self.nodes if n not in bad]


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(errors="replace").strip()
        return int(text) if len(text) < 20 else None  # an exit code, not 5,000 digits
    except (OSError, ValueError):
        return None


def load_pair(results: Path, round_index: int, pair: Pair) -> PairResult:
    base = pair_base(results, round_index, pair)
    res = PairResult(round=round_index + 1, pair=pair)
    res.rc = _read_int(base.with_suffix(".rc"))
    try:
        tasks = base.with_suffix(".tasks").read_text(errors="replace").splitlines()
    except OSError:
        tasks = []
    starts, ends = [], []
    for line in tasks:
        parts = line.split()
        if len(parts) >= 5 and parts[3] == "start":
            res.ran_on.append(parts[1])
            starts.append(float(parts[4]))
        elif len(parts) >= 5 and parts[3] == "end":
            ends.append(float(parts[4]))
    res.start = min(starts) if starts else None
    res.end = max(ends) if ends else None
    try:
        text = base.with_suffix(".out").read_text(errors="replace")
    except OSError:
        res.error = "no output file (step never ran)"
        return res
    runs = parse_nccl_tests(text)
    if runs:
        res.busbw = runs[-1].large_message_busbw()
        res.wrong = runs[-1].wrong_total + (runs[-1].out_of_bounds or 0)
    if res.rc not in (0, None):
        res.error = f"exit code {res.rc}"
    elif res.busbw is None:
        res.error = "no nccl-tests result rows in the output"
    elif res.wrong:
        res.error = f"#wrong > 0 ({res.wrong}): data corruption"
    return res


def load_results(results: Path) -> tuple[dict, list[PairResult]]:
    plan = read_plan(results)
    pairs = [load_pair(results, i, p) for i, rnd in enumerate(plan["rounds"]) for p in rnd]
    return plan, pairs


def check_execution(plan: dict, pairs: list[PairResult]) -> list[str]:
    """What the recorded task lines say about the schedule; [] means it ran as planned."""
    problems = []
    seen: dict[frozenset, int] = {}
    for res in pairs:
        key = frozenset(res.pair)
        seen[key] = seen.get(key, 0) + 1
        if res.ran_on and sorted(set(res.ran_on)) != sorted(res.pair):
            problems.append(f"round {res.round}: pair {res.pair[0]}+{res.pair[1]} ran on "
                            f"{','.join(sorted(set(res.ran_on)))}")
    nodes = plan["nodes"]
    if len(plan["rounds"]) and _full_sweep(plan):  # once, not per pair (was O(N^3))
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                count = seen.get(frozenset((a, b)), 0)
                if count != 1:
                    problems.append(f"pair {a}+{b} measured {count} times (expected once)")
    by_round: dict[int, dict[str, int]] = {}
    for res in pairs:
        used = by_round.setdefault(res.round, {})
        for node in set(res.ran_on):
            used[node] = used.get(node, 0) + 1
    for rnd in sorted(by_round):
        twice = sorted(n for n, c in by_round[rnd].items() if c > 1)
        if twice:
            problems.append(f"round {rnd}: {', '.join(twice)} ran in two pairs at once")
    return problems


def _full_sweep(plan: dict) -> bool:
    n = len(plan["nodes"])
    return sum(len(r) for r in plan["rounds"]) == n * (n - 1) // 2


def round_overlap(pairs: list[PairResult]) -> dict[int, bool]:
    """Per round with 2+ pairs: did the steps really run at the same time? One pass over the
    results (grouped by round first: a scan per round was rounds x pairs)."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for r in pairs:
        if r.start and r.end:
            spans.setdefault(r.round, []).append((r.start, r.end))
    return {rnd: max(s for s, _ in got) < min(e for _, e in got)
            for rnd, got in sorted(spans.items()) if len(got) >= 2}


REFERENCES = ("median", "best")


def analyze(nodes: list[str], values: dict[Pair, float | None], threshold: float = 0.8,
            failed: list[Pair] | None = None, reference: str = "median",
            expected: float | None = None) -> Analysis:
    """Robust outliers against a reference and the node (or link) that explains them.

    The reference is ``median`` (the median of the node medians: one bad node cannot drag it
    down), ``best`` (the best pair the sweep measured, NVIDIA ClusterKit's rule, with 0.93)
    or ``expected`` GB/s when given. A pair is low below ``threshold`` x the reference.
    Nodes and pairs are visited in a fixed order: the same results give the same report."""
    if reference not in REFERENCES:
        raise ValueError(f"reference {reference!r}: use one of {REFERENCES}")
    failed = list(failed or [])
    measured = {frozenset(p): v for p, v in values.items() if v is not None}
    # Every per-node question below is answered from these indexes, built in one pass over
    # the pairs: the report stays linear in the number of pairs (N^2/2), not N^3.
    of_node: dict[str, list[float]] = {n: [] for n in nodes}
    values_of: dict[str, list[tuple[Pair, float | None]]] = {n: [] for n in nodes}
    failed_of: dict[str, list[Pair]] = {n: [] for n in nodes}
    for p, v in measured.items():
        for n in p:
            of_node.setdefault(n, []).append(v)
    for p, v in values.items():
        for n in set(p):
            values_of.setdefault(n, []).append((p, v))
    for p in failed:
        for n in set(p):
            failed_of.setdefault(n, []).append(p)

    node_median = {n: (statistics.median(of_node[n]) if of_node.get(n) else None)
                   for n in nodes}
    medians = [m for m in node_median.values() if m is not None]
    if expected is not None:
        basis: float | None = expected
    elif reference == "best":
        basis = max(measured.values()) if measured else None
    else:
        basis = statistics.median(medians) if medians else None
    cut = threshold * basis if basis else None
    # Sorted, so the report does not depend on the order results were read in.
    low = sorted(p for p, v in values.items() if v is not None and cut is not None and v < cut)
    suspects = [n for n, med in node_median.items()
                if cut is not None and med is not None and med < cut]
    # Failed pairs: a node that fails with most of its partners is the suspect too.
    for n in nodes:
        bad = failed_of.get(n, [])
        tried = len(values_of.get(n, [])) + sum(1 for p in bad if p not in values)
        if n not in suspects and tried and len(bad) * 2 > tried and len(bad) >= 2:
            suspects.append(n)
    suspect_set = set(suspects)
    links = sorted(p for p in set(low) | set(failed) if not (set(p) & suspect_set))
    # Report percentages against healthy pairs only (no suspect involved).
    healthy = [v for p, v in measured.items() if not (set(p) & suspect_set)]
    ref_ok = statistics.median(healthy) if healthy else basis
    messages = []
    for n in suspects:
        mine = values_of.get(n, [])
        vals = [v for _, v in mine if v is not None]
        nfailed = len(failed_of.get(n, []))
        if vals and ref_ok:
            pct = 100.0 * statistics.median(vals) / ref_ok
            lows = sum(1 for v in vals if v < threshold * ref_ok)
            every = "every pair" if lows == len(mine) else f"{lows} of {len(mine)} pairs"
            messages.append(
                f"{every} with {n} is at {pct:.0f} % ({statistics.median(vals):.1f} vs "
                f"{ref_ok:.1f} GB/s): suspect {n}'s NIC or cable"
            )
        else:
            messages.append(f"{nfailed} pairs with {n} failed: suspect {n} (NIC, driver, cable)")
    for a, b in links:
        v = values.get((a, b))
        if v is None:
            messages.append(f"pair {a}+{b} failed while both work with others: suspect the "
                            f"link or switch path between {a} and {b}")
        else:
            pct = 100.0 * v / ref_ok if ref_ok else 0.0
            messages.append(f"pair {a}+{b} is at {pct:.0f} % while both are fine with others: "
                            f"suspect the link or switch path between them")
    if not messages:
        against = (f"{expected:g} GB/s expected" if expected is not None else
                   "the best pair" if reference == "best" else "the median")
        messages.append("no outliers: every pair is within "
                        f"{100 * (1 - threshold):.0f} % of {against}")
    return Analysis(nodes=nodes, reference=ref_ok, threshold=threshold, node_median=node_median,
                    low_pairs=low, failed_pairs=failed, suspect_nodes=suspects,
                    suspect_links=links, messages=messages)


def gpu_stage(results: Path, plan: dict) -> dict[str, str | None]:
    """The burn-in GPU stage per node: None when it passed, else why not (its failing check,
    or no result at all: the node never ran it). Empty when the sweep had no GPU stage."""
    if not plan.get("gpu_stage"):
        return {}
    from slurmfabric.health.state import read_json, safe_name

    verdicts: dict[str, str | None] = {}
    for node in plan["nodes"]:
        report = read_json(results / f"gpu-{safe_name(node)}.json")
        if not isinstance(report, dict):
            verdicts[node] = "no GPU burn-in result (see gpu-stage.out)"
        elif report.get("exit_code") != 0:
            verdicts[node] = str(report.get("reason") or "GPU burn-in failed")[:200]
        else:
            verdicts[node] = None
    return verdicts


def with_gpu_stage(analysis: Analysis, verdicts: dict[str, str | None]) -> Analysis:
    """A node that failed the GPU stage is a suspect too: burn-in needs both stages."""
    failed = [n for n, why in verdicts.items() if why is not None]
    if not failed:
        return analysis
    suspects = analysis.suspect_nodes + [n for n in failed if n not in analysis.suspect_nodes]
    messages = analysis.messages + [f"{n} failed the GPU burn-in: {verdicts[n]}"
                                    for n in failed]
    return replace(analysis, suspect_nodes=suspects, messages=messages)


def matrix(nodes: list[str], values: dict[Pair, float | None]) -> list[list[float | None]]:
    """Symmetric node-by-node matrix; None on the diagonal and for missing pairs."""
    index = {n: i for i, n in enumerate(nodes)}
    m: list[list[float | None]] = [[None] * len(nodes) for _ in nodes]
    for (a, b), v in values.items():
        m[index[a]][index[b]] = m[index[b]][index[a]] = v
    return m


MATRIX_MAX = 32  # nodes up to which the text report prints the whole matrix


def render_table(nodes: list[str], values: dict[Pair, float | None],
                 analysis: Analysis) -> str:
    """Matrix of busbw in GB/s with a '!' on low pairs, then the findings. Beyond
    MATRIX_MAX nodes a matrix is unreadable and quadratic to print: a per-node summary
    (the worst nodes first) takes its place, linear in the number of results."""
    if len(nodes) > MATRIX_MAX:
        return _render_nodes(nodes, values, analysis)
    m = matrix(nodes, values)
    low = {frozenset(p) for p in analysis.low_pairs}
    failed = {frozenset(p) for p in analysis.failed_pairs}
    width = max(8, max(len(n) for n in nodes) + 1)
    lines = ["busbw GB/s".ljust(width) + "".join(n.rjust(width) for n in nodes)]
    for i, a in enumerate(nodes):
        cells = []
        for j, b in enumerate(nodes):
            key = frozenset((a, b))
            if i == j:
                cell = "-"
            elif key in failed:
                cell = "FAIL"
            elif m[i][j] is None:
                cell = "n/a"
            else:
                cell = f"{m[i][j]:.1f}" + ("!" if key in low else "")
            cells.append(cell.rjust(width))
        lines.append(a.ljust(width) + "".join(cells))
    ref = "n/a" if analysis.reference is None else f"{analysis.reference:.1f} GB/s"
    lines.append(f"reference (median of healthy pairs): {ref}; low = below "
                 f"{analysis.threshold:.0%} of the node medians' median ('!')")
    lines += [f"- {msg}" for msg in analysis.messages]
    return "\n".join(lines)


def _render_nodes(nodes: list[str], values: dict[Pair, float | None], analysis: Analysis,
                  shown: int = 20) -> str:
    low_of: dict[str, int] = {}
    pairs_of: dict[str, int] = {}
    for p in values:
        for n in set(p):
            pairs_of[n] = pairs_of.get(n, 0) + 1
    for p in analysis.low_pairs:
        for n in set(p):
            low_of[n] = low_of.get(n, 0) + 1
    suspects = set(analysis.suspect_nodes)

    def order(n: str) -> tuple:
        med = analysis.node_median.get(n)
        return (n not in suspects, med if med is not None else -1.0, n)

    worst = sorted(nodes, key=order)[:max(shown, len(suspects))]
    width = max(8, max(len(n) for n in nodes) + 1)
    lines = [f"{len(nodes)} nodes, {len(values)} pairs; the {len(worst)} lowest node medians:",
             "node".ljust(width) + "median GB/s".rjust(12) + "pairs".rjust(7) + "low".rjust(6)]
    for n in worst:
        med = analysis.node_median.get(n)
        cell = "n/a" if med is None else f"{med:.1f}" + ("!" if n in suspects else "")
        lines.append(n.ljust(width) + cell.rjust(12) + str(pairs_of.get(n, 0)).rjust(7)
                     + str(low_of.get(n, 0)).rjust(6))
    ref = "n/a" if analysis.reference is None else f"{analysis.reference:.1f} GB/s"
    lines.append(f"reference (median of healthy pairs): {ref}; '!' = suspect node; --json "
                 "has every pair")
    lines += [f"- {msg}" for msg in analysis.messages]
    return "\n".join(lines)
