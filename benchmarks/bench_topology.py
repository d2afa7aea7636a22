"""Discovery + plan on the 8-GPU H100 fixture, in process (target: < 50 ms), and the plan
cache's fingerprint (rank/plancache.py) against the plan-only discovery it stands in for,
on the H100 InfiniBand and the RoCE fixture (a RoCE port's GID slots are read too).

    .venv/bin/python benchmarks/bench_topology.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(HERE), str(HERE / "fixtures" / "topology")]

import fakesysfs  # noqa: E402
import nodes  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    t0 = time.perf_counter()
    from slurmfabric.plan import make_plan
    from slurmfabric.topology import discover

    imports = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        root = fakesysfs.build(nodes.h100_ib(), tmp)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            topo = discover(root)
            plan = make_plan(topo, 8, master_addr="10.1.0.2")
            times.append((time.perf_counter() - start) * 1000)
        assert plan.nccl_env["NCCL_IB_HCA"].startswith("=mlx5_0:1")
        start = time.perf_counter()
        for _ in range(args.repeat):
            make_plan(topo, 8, master_addr="10.1.0.2")
        plan_only = (time.perf_counter() - start) * 1000 / args.repeat
    print(f"import slurmfabric.topology + plan: {imports * 1000:.1f} ms")
    print(
        f"discover + make_plan, 8x H100 + 10 NICs, {args.repeat} runs: "
        f"first {times[0]:.1f} ms, median {statistics.median(times):.1f} ms, "
        f"min {min(times):.1f} ms, max {max(times):.1f} ms (target < 50 ms)"
    )
    print(f"make_plan alone: {plan_only:.2f} ms")
    fingerprint_vs_discovery(args.repeat)
    return 0


def fingerprint_vs_discovery(repeat: int) -> None:
    """Medians: what every warm rank reads (the fingerprint) vs what a cold one does."""
    import os

    from slurmfabric.rank import plancache
    from slurmfabric.topology import discover

    for label, node in (("H100 IB", nodes.h100_ib()), ("H100 RoCE", nodes.h100_roce_numa_off())):
        with tempfile.TemporaryDirectory() as tmp:
            root = str(fakesysfs.build(node, tmp))
            extra = plancache.extra_probes(root, dict(os.environ))
            found, read = [], []
            for _ in range(repeat):
                start = time.perf_counter()
                discover(root, plan_only=True)
                found.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                plancache.fingerprint(root, extra)
                read.append((time.perf_counter() - start) * 1000)
        disc, fp = statistics.median(found), statistics.median(read)
        print(f"{label}: plan-only discovery {disc:.2f} ms, cache fingerprint {fp:.2f} ms "
              f"({disc / fp:.0f}x less)")


if __name__ == "__main__":
    raise SystemExit(main())
