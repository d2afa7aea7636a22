"""Per-step cost of the progress helper (``slurmfabric.progress``), the heartbeat every
rank writes once per step.

Baseline, measured in the same run: a synthetic step of fixed work (a pure-Python loop
tuned to about 1 ms, shorter than any real training step, so the ratio is an upper
bound). It then runs the same step with ``progress.step()`` and with
``progress.compute()`` + ``progress.step()`` (two writes) into a tmpfs/local directory,
interleaved in rounds (order rotated) so machine load hits all variants alike; the
minimum over rounds is the least disturbed figure, and prints the per-call
microseconds and the ratio to the baseline. Goal: well under 1% of a step.
``python benchmarks/bench_progress.py [rounds]``
"""

from __future__ import annotations

import os
import sys
import tempfile
import time


def work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def tune() -> int:
    n = 20000
    while True:
        start = time.perf_counter()
        work(n)
        if time.perf_counter() - start >= 0.001:
            return n
        n = int(n * 1.3)


def run(variant: str, n: int, steps: int) -> float:
    import slurmfabric.progress as progress

    start = time.perf_counter()
    for _ in range(steps):
        if variant == "compute":
            with progress.compute():
                work(n)
            progress.step()
        else:
            work(n)
            if variant == "step":
                progress.step()
    return (time.perf_counter() - start) / steps


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    steps = 200
    import slurmfabric.progress as progress

    with tempfile.TemporaryDirectory() as tmp:
        os.environ[progress.ENV] = tmp
        progress._reset_for_tests()
        n = tune()
        # the helper alone, many calls: its own cost per call
        calls = 20000
        start = time.perf_counter()
        for _ in range(calls):
            progress.step()
        per_step = (time.perf_counter() - start) / calls
        start = time.perf_counter()
        for _ in range(calls):
            with progress.compute():
                pass
            progress.step()
        per_both = (time.perf_counter() - start) / calls
        times: dict[str, list[float]] = {"baseline": [], "step": [], "compute": []}
        order = list(times)
        for r in range(rounds):
            for variant in order[r % 3:] + order[:r % 3]:  # rotate: no variant always first
                times[variant].append(run(variant, n, steps))
        progress._reset_for_tests()
    # the minimum over rounds: the least disturbed measurement of each variant
    base = min(times["baseline"])
    print(f"baseline step (fixed work): {base * 1e3:.3f} ms (min over {rounds} rounds "
          f"x {steps} steps)")
    print(f"progress.step() alone: {per_step * 1e6:.1f} us/call = "
          f"{per_step / base * 100:.3f}% of the baseline step")
    print(f"compute() + step() alone: {per_both * 1e6:.1f} us/step = "
          f"{per_both / base * 100:.3f}% of the baseline step")
    for variant in ("step", "compute"):
        ratio = min(times[variant]) / base
        print(f"step with {variant:<8}: ratio to baseline {ratio:.4f} "
              f"({(ratio - 1) * 100:+.2f}%, noise included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
