"""k-batch sweep: groups of k nodes run one collective each, all groups at once.

Microsoft SuperBench's k-batch pattern splits the nodes into groups of k and runs every group
at the same time: a fast screen of a large cluster under load (one round instead of N-1) that
stresses the spine the way a job does. One round cannot tell which member of a slow group is
to blame, so this sweep runs two: round 1 takes consecutive blocks of k, round 2 regroups the
same nodes by stride, so two nodes share at most one group when N >= k^2 (the remainder of
N / k joins the last groups; nccl-tests' bus bandwidth is comparable across group sizes, see
nccl-tests doc/PERFORMANCE.md). A slow group's ring runs at its slowest member's rate, so a
node in a good group is cleared; a node is named when it is the only member of a slow group
that no good group cleared. Anything else is left unresolved and the report prints the
pair sweep that settles it. Standard library only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from slurmfabric.errors import UsageError

Group = tuple[str, ...]


def batch_rounds(nodes: list[str], k: int) -> list[list[Group]]:
    """Two rounds of groups of about ``k`` nodes: blocks, then the same nodes by stride."""
    if len(set(nodes)) != len(nodes):
        raise UsageError(f"duplicate node names in {nodes}", hint="list each node once")
    if k < 2:
        raise UsageError(f"--batch {k}: a group needs at least 2 nodes")
    count = len(nodes) // k
    if count < 2:
        raise UsageError(f"--batch {k} with {len(nodes)} nodes gives one group: nothing to "
                         "compare it with", hint=f"use --batch {max(2, len(nodes) // 2)} or "
                         "less, or the round-robin pattern")
    blocks: list[list[str]] = [list(nodes[i * k:(i + 1) * k]) for i in range(count)]
    for i, node in enumerate(nodes[count * k:]):  # the remainder joins groups, one each
        blocks[i % count].append(node)
    strided: list[list[str]] = [[] for _ in range(count)]
    for i, node in enumerate(nodes):
        strided[i % count].append(node)
    return [[tuple(g) for g in blocks], [tuple(g) for g in strided]]


def group_name(index: int) -> str:
    """File stem of a group's results (a list of node names would pass NAME_MAX)."""
    return f"group-{index + 1:03d}"


@dataclass
class BatchAnalysis:
    reference: float | None
    threshold: float
    low: list[tuple[int, Group]]  # (round, members) below the bar
    failed: list[tuple[int, Group]]
    suspect_nodes: list[str]
    unresolved: list[str]  # in a bad group, cleared by no good group, not alone
    unexplained: list[tuple[int, Group]]  # bad groups whose members all pass elsewhere
    messages: list[str] = field(default_factory=list)

    def follow_up(self, nodes: list[str], results: str) -> str | None:
        """The pair sweep that tells the unresolved nodes apart (with one cleared node)."""
        if not self.unresolved and not self.unexplained:
            return None
        wanted = set(self.unresolved) | {n for _, g in self.unexplained for n in g}
        cleared = [n for n in nodes if n not in wanted and n not in self.suspect_nodes]
        chosen = [n for n in nodes if n in wanted] + cleared[:1]
        return (f"slurmfabric pairs submit --nodes {','.join(chosen)} "
                f"--results {results.rstrip('/')}-pairs")


def analyze_batches(groups: list[tuple[int, Group, float | None]], threshold: float = 0.8,
                    reference: str = "median", expected: float | None = None
                    ) -> BatchAnalysis:
    """``groups``: (round, members, bus bandwidth or None when it failed), in plan order."""
    values = [v for _, _, v in groups if v is not None]
    if expected is not None:
        basis: float | None = expected
    elif reference == "best":
        basis = max(values) if values else None
    else:
        basis = statistics.median(values) if values else None
    cut = threshold * basis if basis else None
    low = [(r, g) for r, g, v in groups if v is not None and cut is not None and v < cut]
    failed = [(r, g) for r, g, v in groups if v is None]
    bad = low + failed
    cleared = {n for r, g, v in groups if (r, g) not in bad for n in g}
    suspects: set[str] = set()
    unresolved: set[str] = set()
    for _, g in bad:  # alone in a slow group, cleared nowhere: that node
        left = [n for n in g if n not in cleared]
        if len(left) == 1:
            suspects.add(left[0])
    for _, g in bad:  # a slow group no suspect explains: its uncleared members
        if not suspects & set(g):
            unresolved.update(n for n in g if n not in cleared)
    value = {(r, g): v for r, g, v in groups}
    messages = []
    for node in sorted(suspects):
        mine = [(r, g) for r, g in bad if node in g]
        figures = ", ".join(
            f"round {r}: " + (f"{100 * value[(r, g)] / basis:.0f} %"  # type: ignore[operator]
                              if value[(r, g)] is not None and basis else "failed")
            for r, g in mine)
        messages.append(f"{node} is in {len(mine)} slow group(s) ({figures}) and in no good "
                        f"one: suspect {node}'s NIC or cable")
    if unresolved:
        messages.append(f"{', '.join(sorted(unresolved))}: in slow groups, never in a good "
                        "one, not told apart yet: run the pair sweep below")
    unexplained_groups = [(r, g) for r, g in bad if all(n in cleared for n in g)]
    for r, g in unexplained_groups:
        messages.append(f"round {r} group {'+'.join(g[:4])}{'...' if len(g) > 4 else ''} "
                        "was slow while each member is fine in another group: the switch "
                        "path of that group, or noise (run the pair sweep below)")
    if not messages:
        messages.append(f"no outliers: every group is within {100 * (1 - threshold):.0f} % "
                        "of the reference")
    return BatchAnalysis(reference=basis, threshold=threshold, low=low, failed=failed,
                         suspect_nodes=sorted(suspects), unresolved=sorted(unresolved),
                         unexplained=unexplained_groups, messages=messages)
