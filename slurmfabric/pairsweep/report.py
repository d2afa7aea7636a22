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

from slurmfabric.nccl.tests import parse as parse_nccl_tests
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
    retest: int = 0  # 0: the sweep itself; k: retest pass k
    rails: dict[str, float | None] = field(default_factory=dict)  # per-rail tests: Gb/s

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
    # Low or failed pairs whose nodes were not measured well with another partner: node or
    # link cannot be told apart yet (a retest pairs each node with a good one).
    unresolved: list[Pair] = field(default_factory=list)
    # Nodes whose bad pairs a degraded switch-to-switch cable explains (``with_cables``).
    behind_cables: list[str] = field(default_factory=list)
    # A bimodal sweep's slow mode (``slow_group``): one shared cause, not N bad nodes.
    slow_group: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> list[Pair]:
        """Every pair below the bar or failed, in a fixed order."""
        return sorted(set(self.low_pairs) | set(self.failed_pairs))

    @property
    def passing_nodes(self) -> list[str]:
        bad = set(self.suspect_nodes) | set(self.behind_cables) | set(self.slow_group) | {
            n for p in self.suspect_links + self.unresolved for n in p}
        return [n for n in self.nodes if n not in bad]


def _read_result(path: Path, what: str) -> str | None:
    """A step's file, or None when it never wrote one; read through inputfile (a regular
    file after links, capped: a link to /dev/zero in the results is an error naming it)."""
    from slurmfabric._common.inputfile import read_result

    return read_result(str(path), what)


def _read_int(path: Path) -> int | None:
    text = (_read_result(path, "exit code file") or "").strip()
    try:
        return int(text) if len(text) < 20 else None  # an exit code, not 5,000 digits
    except ValueError:
        return None


def load_pair(results: Path, round_index: int, pair: Pair, retest: int = 0,
              test: str = "nccl-tests", base: Path | None = None) -> PairResult:
    if base is None:
        base = pair_base(results / f"retest-{retest}" if retest else results, round_index,
                         pair)
    res = PairResult(round=round_index + 1, pair=pair, retest=retest)
    res.rc = _read_int(base.with_suffix(".rc"))
    tasks = (_read_result(base.with_suffix(".tasks"), "task record") or "").splitlines()
    starts, ends = [], []
    for line in tasks:
        parts = line.split()
        if len(parts) < 5 or parts[3] not in ("start", "end"):
            continue
        try:
            when = float(parts[4])
        except ValueError:
            continue  # not a line the task wrapper wrote
        if parts[3] == "start":
            res.ran_on.append(parts[1])
            starts.append(when)
        else:
            ends.append(when)
    res.start = min(starts) if starts else None
    res.end = max(ends) if ends else None
    text = _read_result(base.with_suffix(".out"), "step output")
    if text is None:
        res.error = "no output file (step never ran)"
        return res
    if test in PERFTEST_TOOLS:
        return _perftest_pair(res, text)
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


PERFTEST_TOOLS = ("ib_write_bw", "ib_read_bw", "ib_send_bw")


def _perftest_pair(res: PairResult, text: str) -> PairResult:
    """A per-rail RDMA pair: each rail's client output; the pair is as fast as its slowest
    rail (in Gb/s: perftest's unit with --report_gbits), and fails if any rail failed."""
    from slurmfabric.pairsweep.perftest import parse as parse_perftest
    from slurmfabric.pairsweep.rdmastep import split_rails

    problems = []
    for rail, output in split_rails(text).items():
        run = parse_perftest(output)
        res.rails[rail] = run.bandwidth_gbps if run.ok else None
        if not run.ok:
            problems.append(f"rail {rail}: {run.errors[0] if run.errors else 'no result'}")
    values = [v for v in res.rails.values() if v is not None]
    res.busbw = min(values) if values and not problems else None
    if not res.rails:
        res.error = "no rail results in the output (rdma-step did not run)"
    elif problems:
        res.error = "; ".join(problems)[:300]
    elif res.rc not in (0, None):
        res.error = f"exit code {res.rc}"
    return res


def slow_rails(pairs: list[PairResult], analysis: Analysis) -> list[str]:
    """For per-rail sweeps: a suspect node's rail that is low in most of its pairs while
    its other rails are fine (a single bad HCA, cable or switch port of one rail)."""
    out = []
    last = list({frozenset(r.pair): r for r in pairs}.values())  # a retest replaces a pair
    for node in analysis.suspect_nodes + [n for p in analysis.flagged for n in p]:
        per_rail: dict[str, list[float]] = {}
        for res in last:
            if node in res.pair:
                for rail, value in res.rails.items():
                    if value is not None:
                        per_rail.setdefault(rail, []).append(value)
        if len(per_rail) < 2:
            continue
        medians = {rail: statistics.median(v) for rail, v in per_rail.items()}
        best = max(medians.values())
        for rail, med in sorted(medians.items()):
            line = (f"rail {rail} of {node} is at {100 * med / best:.0f} % of its best rail "
                    f"({med:.1f} vs {best:.1f} Gb/s)")
            if med < analysis.threshold * best and line not in out:
                out.append(line)
    return out


def load_results(results: Path) -> tuple[dict, list[PairResult]]:
    """The sweep's pairs, then each retest pass's (``retest-K.pairs`` lists what ran)."""
    plan = read_plan(results)
    test = str(plan.get("test") or "nccl-tests")
    pairs = [load_pair(results, i, p, test=test) for i, rnd in enumerate(plan["rounds"])
             for p in rnd]
    known = set(plan["nodes"])
    for k in range(1, MAX_RETESTS + 1):  # the passes that ran, in order
        listed = results / f"retest-{k}.pairs"
        if not listed.exists():
            break
        for round_index, pair in read_retest(listed, known):
            pairs.append(load_pair(results, round_index, pair, k, test))
    return plan, pairs


MAX_RETESTS = 10  # as 'pairs submit --retests' allows


def load_groups(results: Path) -> tuple[dict, list[PairResult]]:
    """A k-batch sweep's groups (``round-NN/group-NNN.*``), in plan order."""
    from slurmfabric.pairsweep.batch import group_name

    plan = read_plan(results)
    return plan, [load_pair(results, i, g, base=results / f"round-{i + 1:02d}" / group_name(j))
                  for i, rnd in enumerate(plan["rounds"]) for j, g in enumerate(rnd)]


def read_retest(path: Path, nodes: set[str]) -> list[tuple[int, Pair]]:
    """``NN a b`` lines of a retest pass (what 'pairs retest-plan' printed); lines that do
    not name two sweep nodes are not ours and are skipped."""
    lines = (_read_result(path, "retest list") or "").splitlines()[:100_000]
    out = []
    for line in lines:
        parts = line.split()
        if (len(parts) == 3 and parts[0].isascii() and parts[0].isdigit()
                and len(parts[0]) < 6 and parts[1] in nodes and parts[2] in nodes):
            out.append((int(parts[0]) - 1, (parts[1], parts[2])))
    return out


def latest(pairs: list[PairResult]) -> tuple[dict[Pair, float | None], list[Pair]]:
    """Each pair's last measurement (a retest replaces the sweep's): values and failures,
    keyed by the pair as the sweep first named it."""
    name: dict[frozenset, Pair] = {}
    last: dict[frozenset, PairResult] = {}
    for res in pairs:
        key = frozenset(res.pair)
        name.setdefault(key, res.pair)
        last[key] = res
    values = {name[k]: (r.busbw if r.ok else None) for k, r in last.items()}
    return values, [name[k] for k, r in last.items() if not r.ok]


def retest_pairs(analysis: Analysis, partners: int = 2,
                 measured: dict[frozenset, int] | None = None) -> list[Pair]:
    """What the next retest pass runs: every flagged pair not yet confirmed (measured bad
    twice: a retest that agrees ends it, so the passes shrink), and for each node of a pair
    not yet explained (not a suspect node, not a link between good nodes) up to
    ``partners`` nodes that are good with everyone, so node and link can be told apart."""
    measured = measured or {}
    flagged = analysis.flagged
    involved = {n for p in flagged for n in p}
    good = [n for n in analysis.nodes if n not in involved]
    out = [p for p in flagged if measured.get(frozenset(p), 1) < 2]
    needy = sorted({n for p in analysis.unresolved for n in p})
    turn = 0
    for node in needy:
        for _ in range(min(partners, len(good))):
            partner = good[turn % len(good)]
            turn += 1
            if frozenset((node, partner)) not in measured:
                out.append((node, partner))
    return out


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


def slow_group(values: dict[Pair, float | None],
               threshold: float) -> tuple[list[str], list[str]] | None:
    """(slow nodes, fast nodes) when the sweep is bimodal, else None.

    A pair runs at the slower node's rate, so each node's best pair is its own rate: a
    healthy node has a healthy partner somewhere, a node of the slow mode has none. The
    nodes' best pairs, sorted, are split at their largest ratio gap; it is a group when both
    sides hold 2+ nodes and the gap itself is below ``threshold`` (42 % vs 100 %, not the
    spread within one mode)."""
    best: dict[str, float] = {}
    partners: dict[str, int] = {}
    for pair, value in values.items():
        if value is not None:
            for node in pair:
                best[node] = max(best.get(node, 0.0), value)
                partners[node] = partners.get(node, 0) + 1
    # A node measured with one partner says nothing about its own rate (one low pair is
    # the node, its partner or the path: a retest decides that, not a group).
    ranked = sorted((value, node) for node, value in best.items() if partners[node] >= 2)
    if len(ranked) < 4:
        return None

    def ratio(k: int) -> float:
        low, high = ranked[k][0], ranked[k + 1][0]
        return high / low if low > 0 else float("inf")

    cut = max(range(len(ranked) - 1), key=ratio)
    slow, fast = ranked[:cut + 1], ranked[cut + 1:]
    if len(slow) < 2 or len(fast) < 2 or not slow[-1][0] < threshold * fast[0][0]:
        return None
    return [n for _, n in slow], [n for _, n in fast]


def analyze(nodes: list[str], values: dict[Pair, float | None], threshold: float = 0.8,
            failed: list[Pair] | None = None, reference: str = "median",
            expected: float | None = None, groups: bool = True) -> Analysis:
    """The per-node analysis (``_analyze``), unless the sweep is bimodal and that analysis
    fails on it: half the nodes at 42 % pull the median of node medians down to their rate
    (no outliers), and an absolute reference blames every node. Then the slow mode is
    reported as one group with a shared cause and the fast mode is analysed on its own."""
    result = _analyze(nodes, values, threshold, failed, reference, expected)
    split = slow_group(values, threshold) if groups else None
    if split is None:
        return result
    order = {n: i for i, n in enumerate(nodes)}  # linear: a sweep may hold 8,192 nodes
    slow_nodes, fast_nodes = (sorted(side, key=lambda n: (order.get(n, len(order)), n))
                              for side in split)
    slow = set(slow_nodes)
    touching = {p: v for p, v in values.items() if v is not None and set(p) & slow}
    flagged_low = set(result.low_pairs)
    missed = any(p not in flagged_low for p in touching)
    spilled = any(n not in slow for n in result.suspect_nodes) or any(
        set(p) & slow for p in result.suspect_links + result.unresolved)
    if not (missed or spilled):
        return result  # the per-node rule already names exactly the slow nodes
    inner_values = {p: v for p, v in values.items() if not set(p) & slow}
    inner_failed = [p for p in failed or [] if not set(p) & slow]
    inner = _analyze(fast_nodes, inner_values, threshold, inner_failed, reference, expected)
    fast_rate = inner.reference or max(touching.values())
    slow_rate = statistics.median(touching.values())
    pct = 100.0 * slow_rate / fast_rate if fast_rate else 0.0
    message = (f"{len(slow_nodes)} of {len(nodes)} nodes form a slow group at {pct:.0f} % of "
               f"the fast group ({slow_rate:.1f} vs {fast_rate:.1f} GB/s): suspect a shared "
               f"cause (switch, firmware, config), not each node: {', '.join(slow_nodes)}")
    low = sorted(set(inner.low_pairs) | {p for p, v in touching.items()
                                         if v < threshold * fast_rate})
    return replace(inner, nodes=nodes, node_median=result.node_median, low_pairs=low,
                   failed_pairs=sorted(failed or []), slow_group=slow_nodes,
                   messages=[message] + [m for m in inner.messages
                                         if not m.startswith("no outliers")])


def _analyze(nodes: list[str], values: dict[Pair, float | None], threshold: float = 0.8,
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
    # A node is named only when its pairs are bad (low or failed) with several partners,
    # most of those it was measured with: one bad pair can be the other node or the path.
    bad_of: dict[str, set[str]] = {}
    tried_of: dict[str, set[str]] = {}
    for p in set(low) | set(failed):
        for n in p:
            bad_of.setdefault(n, set()).update(x for x in p if x != n)
    for p in list(values) + failed:
        for n in p:
            tried_of.setdefault(n, set()).update(x for x in p if x != n)
    suspects = [n for n in nodes if len(bad_of.get(n, ())) >= 2
                and 2 * len(bad_of[n]) > len(tried_of.get(n, ()))]
    suspect_set = set(suspects)
    rest = sorted(p for p in set(low) | set(failed) if not (set(p) & suspect_set))
    # A link only when both its nodes are good with someone else.
    good_elsewhere = {n for n in nodes
                      if len(tried_of.get(n, ())) > len(bad_of.get(n, ()))}
    links = [p for p in rest if all(n in good_elsewhere for n in p)]
    unresolved = [p for p in rest if p not in links]
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
    for a, b in unresolved:
        v = values.get((a, b))
        what = "failed" if v is None else (
            f"is at {100.0 * v / ref_ok:.0f} %" if ref_ok else "is low")
        messages.append(f"pair {a}+{b} {what} and neither node was measured well with another "
                        "partner: node or link is not known yet (pairs submit --retests)")
    if not messages:
        against = (f"{expected:g} GB/s expected" if expected is not None else
                   "the best pair" if reference == "best" else "the median")
        messages.append("no outliers: every pair is within "
                        f"{100 * (1 - threshold):.0f} % of {against}")
    return Analysis(nodes=nodes, reference=ref_ok, threshold=threshold, node_median=node_median,
                    low_pairs=low, failed_pairs=sorted(failed), suspect_nodes=suspects,
                    suspect_links=links, messages=messages, unresolved=unresolved)


def gpu_stage(results: Path, plan: dict) -> dict[str, str | None]:
    """The burn-in GPU stage per node: None when it passed, else why not (its failing check,
    or no result at all: the node never ran it). Empty when the sweep had no GPU stage."""
    if not plan.get("gpu_stage"):
        return {}
    import json

    from slurmfabric._common.files import safe_name

    verdicts: dict[str, str | None] = {}
    for node in plan["nodes"]:
        text = _read_result(results / f"gpu-{safe_name(node)}.json", "GPU burn-in result")
        try:
            report = json.loads(text) if text is not None else None
        except (ValueError, RecursionError):
            report = None
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


def render_markdown(nodes: list[str], values: dict[Pair, float | None], analysis: Analysis,
                    drift: list[str], recovered: list[Pair], retested: int) -> str:
    """The findings as Markdown (for a ticket or a wiki page), then the per-node medians."""
    ref = "n/a" if analysis.reference is None else f"{analysis.reference:.1f} GB/s"
    lines = ["# Pair sweep report", "",
             f"{len(nodes)} nodes, {len(values)} pairs, {retested} retests; reference "
             f"(median of healthy pairs) {ref}.", "", "## Findings", ""]
    lines += [f"- {msg}" for msg in analysis.messages]
    lines += [f"- drift: {msg}" for msg in drift]
    lines += [f"- pair {a}+{b} was low at first and fine when retested" for a, b in recovered]
    suspects = set(analysis.suspect_nodes)
    lines += ["", "## Nodes", "", "| node | median GB/s | verdict |", "|---|---:|---|"]
    for n in sorted(nodes, key=lambda n: (n not in suspects, analysis.node_median.get(n) or 0,
                                          n)):
        med = analysis.node_median.get(n)
        verdict = "suspect" if n in suspects else "slow group" if n in analysis.slow_group \
            else ("pass" if n in set(analysis.passing_nodes) else "in a flagged pair")
        lines.append(f"| {n} | {'n/a' if med is None else f'{med:.1f}'} | {verdict} |")
    return "\n".join(lines)


def with_cables(analysis: Analysis, cables: list) -> Analysis:
    """Add what the topology says (``paths.shared_cables``): each candidate cable, and a
    node whose bad pairs a switch-to-switch cable explains is that cable's victim, not a
    suspect (a degraded uplink makes every node behind it look bad)."""
    if not cables:
        return analysis
    uplinks = [c for c in cables if c.access is None]
    victims = []
    for node in analysis.suspect_nodes:
        mine = [p for p in analysis.flagged if node in p]
        if mine and any(all(p in c.explains for p in mine) for c in uplinks):
            victims.append(node)
    suspects = [n for n in analysis.suspect_nodes if n not in victims]
    messages = [m for m in analysis.messages
                if not any(m.startswith(f"every pair with {v} ") or
                           f" pairs with {v} " in m for v in victims)]
    messages += [c.message() for c in cables]
    messages += [f"{v}: every bad pair of it crosses a cable named above: not a suspect "
                 "itself" for v in victims]
    return replace(analysis, suspect_nodes=suspects, messages=messages, behind_cables=victims)
