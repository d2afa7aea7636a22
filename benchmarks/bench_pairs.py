"""``pairs report`` analysis time against the node count: it should grow like the number of
pairs (N^2/2), so doubling N costs about 4x, not 8x (it did, before issue 12).

Builds a full round-robin plan and synthetic bandwidths (one slow node, one slow link) for
N = 64, 128, 256 nodes and times ``check_execution`` + ``analyze``; prints each time and its
ratio to N = 64, next to the pair-count ratio.

    .venv/bin/python benchmarks/bench_pairs.py
"""

from __future__ import annotations

import time

from slurmfabric.pairsweep.plan import round_robin
from slurmfabric.pairsweep.report import PairResult, analyze, check_execution


def case(n: int) -> float:
    nodes = [f"n{i:04d}" for i in range(n)]
    rounds = round_robin(nodes)
    plan = {"nodes": nodes, "rounds": rounds}
    pairs, values = [], {}
    for r, rnd in enumerate(rounds):
        for a, b in rnd:
            res = PairResult(round=r + 1, pair=(a, b))
            res.ran_on = [a, b]
            pairs.append(res)
            slow = a == nodes[3] or b == nodes[3] or {a, b} == {nodes[5], nodes[9]}
            values[(a, b)] = 180.0 if slow else 360.0
    start = time.perf_counter()
    check_execution(plan, pairs)
    result = analyze(nodes, values)
    elapsed = time.perf_counter() - start
    assert nodes[3] in result.suspect_nodes, result.messages
    return elapsed


def main() -> None:
    base = None
    for n in (64, 128, 256):
        seconds = min(case(n) for _ in range(3))
        base = base or seconds
        print(f"N={n:4d}  pairs={n * (n - 1) // 2:6d}  {seconds * 1e3:8.1f} ms  "
              f"{seconds / base:5.1f}x N=64 (pairs: {(n * (n - 1)) / (64 * 63):4.1f}x)")


if __name__ == "__main__":
    main()
