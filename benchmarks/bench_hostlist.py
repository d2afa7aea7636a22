"""Expand and compress 100,000 names: slurmfabric.slurm.hostlist vs python-hostlist (GPL).

python-hostlist is imported here only, to compare; slurmfabric never imports it.
Run: .venv/bin/python benchmarks/bench_hostlist.py
"""

from __future__ import annotations

import statistics
import time

from slurmfabric.slurm import hostlist

try:
    import hostlist as python_hostlist  # GPL: benchmark comparison only
except ImportError:  # pragma: no cover
    python_hostlist = None

N = 100_000
CASES = {
    "two ranges n[000001-050000,050001-100000]": "n[000001-050000,050001-100000]",
    "two groups rack[01-100]-node[0001-1000]": "rack[01-100]-node[0001-1000]",
    "1,000 short ranges": ",".join(f"c{r:03d}n[{1:03d}-{100:03d}]" for r in range(1000)),
}


def best(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print(f"{'case':42} {'op':9} {'slurmfabric':>12} {'python-hostlist':>16} {'speed-up':>9}")
    for label, expr in CASES.items():
        names = hostlist.expand(expr)
        assert len(names) == N, (label, len(names))
        ours_e = best(lambda e=expr: hostlist.expand(e))
        ours_c = best(lambda n=names: hostlist.compress(n))
        if python_hostlist is not None:
            assert python_hostlist.expand_hostlist(expr) == names
            theirs_e = best(lambda e=expr: python_hostlist.expand_hostlist(e))
            theirs_c = best(lambda n=names: python_hostlist.collect_hostlist(n), repeat=3)
        else:
            theirs_e = theirs_c = float("nan")
        for op, ours, theirs in (("expand", ours_e, theirs_e), ("compress", ours_c, theirs_c)):
            print(
                f"{label:42} {op:9} {ours * 1e3:10.1f}ms {theirs * 1e3:14.1f}ms "
                f"{theirs / ours:8.1f}x"
            )


if __name__ == "__main__":
    main()
