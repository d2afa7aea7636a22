"""Peak memory of ``slurmfabric nccl-tests parse`` on a 200 MB nccl-tests output (issue 46).

Writes three 200 MB outputs into a temporary directory (never the checkout), each in the
format nccl-tests 2.17 prints (src/common.cu, src/util.cu of NVIDIA/nccl-tests):

* ``cycles``: one all_reduce_perf run on 64 ranks whose sweep repeats (``-N 0`` runs
  cycles until killed), 8 B to 8 GiB per cycle, a row of #wrong > 0 in the middle;
* ``runs``: many short runs one after another (a pair sweep's step outputs concatenated);
* ``info``: a 1,024-rank run with ``NCCL_DEBUG=INFO``: NCCL lines with the table at the end;

then runs ``slurmfabric nccl-tests parse FILE --ports 8`` on each in a fresh process and
prints its peak RSS (``ru_maxrss`` of that child, from wait4) and wall time. The goal: under
200 MB of RSS for each. ``--src DIR`` runs the slurmfabric of another checkout (e.g. the
main branch) for a before/after figure.

``python benchmarks/bench_nccl_tests_memory.py [--mb 200] [--src DIR]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703\n"
          "# Collective test starting: all_reduce_perf\n"
          "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 "
          "iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n")
_NAMES = ("size", "count", "type", "redop", "root") + ("time", "algbw", "busbw", "#wrong") * 2
COLUMNS = ("#\n#" + " " * 62 + "out-of-place" + " " * 23 + "in-place\n"
           "# " + "  ".join(f"{n:>10}" for n in _NAMES) + "\n")
FOOTER = """# Out of bounds values : 0 OK
# Avg bus bandwidth    : 71.5523
#
# Collective test concluded: all_reduce_perf
"""


def devices(ranks: int, per_node: int = 8) -> str:
    return "".join(
        f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on  gpu-{r // per_node:04d} device "
        f"{r % per_node:2d} [0000:{0x18 + r % per_node:02x}:00] NVIDIA H100 80GB HBM3\n"
        for r in range(ranks))


def row(size: int, wrong: int = 0) -> str:
    count = max(size // 4, 2)
    busbw = min(360.0, size / 2.0e7)
    time_us = max(20.0, size / (busbw * 1e3 + 1))
    cells = f"  {time_us:7.2f}  {busbw / 1.9:6.2f}  {busbw:6.2f}  {wrong:6d}"
    return f"{size:12d}  {count:12d}     float     sum      -1{cells}{cells}\n"


SIZES = [8 << k for k in range(31)]  # 8 B .. 8 GiB


def write_cycles(path: Path, target: int) -> None:
    with path.open("w") as out:
        out.write(HEADER + devices(64) + COLUMNS)
        cycle = "".join(row(s) for s in SIZES)
        written, n = 0, 0
        while written < target:
            text = row(SIZES[12], wrong=3) if n == 1000 else cycle
            out.write(text)
            written += len(text)
            n += 1
        out.write(FOOTER)


def write_runs(path: Path, target: int) -> None:
    one = HEADER + devices(16) + COLUMNS + "".join(row(s) for s in SIZES[20:]) + FOOTER
    with path.open("w") as out:
        for _ in range(target // len(one) + 1):
            out.write(one)


def write_info(path: Path, target: int) -> None:
    with path.open("w") as out:
        out.write(HEADER + devices(1024))
        written, n = 0, 0
        while written < target:
            rank = n % 1024
            line = (f"gpu-{rank // 8:04d}:{4000 + rank}:{5000 + rank} [{rank % 8}] NCCL INFO "
                    f"Channel {n % 32:02d}/0 : {rank}[{rank % 8}] -> {(rank + 8) % 1024}"
                    f"[{rank % 8}] [send] via NET/IB/{rank % 8}/GDRDMA\n")
            out.write(line)
            written += len(line)
            n += 1
        out.write(COLUMNS + "".join(row(s) for s in SIZES) + FOOTER)


def measure(path: Path, src: str | None) -> tuple[int, float, int]:
    """(peak RSS in KiB, wall seconds, exit code) of one parse in a fresh process."""
    code = ("import sys; sys.argv[0] = 'slurmfabric'; "
            + (f"sys.path.insert(0, {src!r}); " if src else "")
            + "from slurmfabric.cli import main; sys.exit(main())")
    argv = [sys.executable, "-c", code, "nccl-tests", "parse", str(path), "--ports", "8"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.stderr is not None:
        proc.stderr.close()
    return usage.ru_maxrss, wall, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="size of each output (MB)")
    parser.add_argument("--src", help="checkout whose slurmfabric to run (default: this one)")
    args = parser.parse_args()
    target = args.mb * 1000 * 1000
    worst = 0
    with tempfile.TemporaryDirectory(prefix="sf-bench-nccl-tests-") as tmp:
        for name, write in (("cycles", write_cycles), ("runs", write_runs),
                            ("info", write_info)):
            path = Path(tmp) / f"{name}.txt"
            write(path, target)
            size = path.stat().st_size
            rss, wall, rc = measure(path, args.src)
            worst = max(worst, rss)
            print(f"{name:7s} {size / 1e6:7.1f} MB output: peak RSS {rss / 1024:7.1f} MiB, "
                  f"{wall:6.1f} s, exit {rc}")
            path.unlink()
    goal = worst < 200 * 1024
    print(f"worst peak RSS {worst / 1024:.1f} MiB: {'under' if goal else 'OVER'} 200 MiB")
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main())
