"""A stand-in for ``all_reduce_perf`` on machines without GPUs: same output, chosen bandwidth.

Run as a job step (``srun ... python tests/fakebw.py -b 1G -e 8G -f 2``): a test double,
kept out of the package.
Rank 0 (``SLURM_PROCID``) prints nccl-tests' exact format (the printf formats of
nccl-tests ``src/common.cu``); other ranks print nothing, as with an MPI build. The step's
nodes come from ``SLURM_STEP_NODELIST`` (or ``--nodes``) and each node's bus bandwidth
from ``SLURMFABRIC_FAKEBW``: a JSON object ``{"sfn3": 180}`` or ``@/path/to/map.json``;
nodes not named get ``SLURMFABRIC_FAKEBW_DEFAULT`` (360 GB/s). A pair runs at the slower
node's rate, as a real link does. ``SLURMFABRIC_FAKEBW_SECONDS`` (default 1) keeps the step
alive that long so concurrent steps overlap measurably. Standard library only.
"""

# ruff: noqa: UP031  -- printf-style on purpose: these are nccl-tests' own C formats.
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from slurmfabric.slurm.hostlist import expand

HALF_SIZE = 64 << 20  # bytes at which the ramp reaches half of the peak (latency-bound below)


def parse_size(text: str) -> int:
    """nccl-tests sizes: ``8``, ``512K``, ``1M``, ``8G`` (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip()
    if text and text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def bandwidth_map() -> dict[str, float]:
    raw = os.environ.get("SLURMFABRIC_FAKEBW", "").strip()
    if raw.startswith("@"):
        with open(raw[1:], encoding="utf-8") as handle:
            raw = handle.read()
    data = json.loads(raw) if raw else {}
    return {str(k): float(v) for k, v in data.items()}


def _time_str(usec: float) -> str:
    if usec >= 10000.0:
        return "%7.0f" % usec
    if usec >= 100.0:
        return "%7.1f" % usec
    return "%7.2f" % usec


def render(nodes: list[str], peak: float, minbytes: int, maxbytes: int, factor: int,
           ranks_per_node: int = 1, pid: int = 0, iters: int = 20, warmup: int = 5) -> str:
    """The whole all_reduce_perf stdout for ``nodes`` at ``peak`` GB/s busbw."""
    nranks = len(nodes) * ranks_per_node
    out = [
        "# nThread 1 nGpus 1 minBytes %d maxBytes %d step: %d(factor) warmup iters: %d "
        "iters: %d agg iters: 1 validation: 1 graph: 0" % (minbytes, maxbytes, factor, warmup,
                                                           iters),
        "#",
        "# Using devices",
    ]
    for rank in range(nranks):
        host = nodes[rank // ranks_per_node]
        out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s" % (
            rank, 0, pid + rank, host, rank % ranks_per_node, 0, "slurmfabric fakebw (no GPU)"))
    out += [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
        "          " % ("", "", "", "", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s" % (
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
            "time", "algbw", "busbw", "#wrong"),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s" % (
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
            "(GB/s)", ""),
    ]
    factor_bus = 2.0 * (nranks - 1) / nranks if nranks > 1 else 1.0
    total, count = 0.0, 0
    size = minbytes
    while size <= maxbytes:
        busbw = peak * size / (size + HALF_SIZE)
        algbw = busbw / factor_bus
        usec = size / (algbw * 1e9) * 1e6 if algbw > 0 else 0.0
        line = "%12d  %12d  %8s  %6s  %6s" % (size, size // 4, "float", "sum", "%6i" % -1)
        for _ in ("out-of-place", "in-place"):
            line += "  %7s  %6.2f  %6.2f  %5g" % (_time_str(usec), algbw, busbw, 0)
            total += busbw
            count += 1
        out.append(line)
        size = size * factor if factor > 1 else size + (1 << 20)
    out += [
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : %g " % (total / count if count else 0.0),
        "#",
        "",
    ]
    return "\n".join(out) + "\n"


def sweep_results(results, nodes, rates, broken=()):
    """A pair sweep's results directory as its job writes it, each pair's output from this
    double at the slower node's rate (``rates``: node -> GB/s, others 360); pairs in
    ``broken`` exit 1 with no output. Returns the sweep plan."""
    from slurmfabric.pairsweep.plan import SweepPlan, pair_base, round_robin, write_plan

    plan = SweepPlan(nodes=list(nodes), rounds=round_robin(list(nodes)), results=results)
    write_plan(plan)
    for i, rnd in enumerate(plan.rounds):
        for pair in rnd:
            base = pair_base(plan.results, i, pair)
            base.parent.mkdir(parents=True, exist_ok=True)
            bw = min(rates.get(n, 360.0) for n in pair)
            failed = set(pair) in [set(b) for b in broken]
            base.with_suffix(".out").write_text(
                "" if failed else render(list(pair), bw, 1 << 30, 8 << 30, 2))
            base.with_suffix(".rc").write_text("1\n" if failed else "0\n")
            base.with_suffix(".tasks").write_text("".join(
                f"{k} {n} {i}.0 start {10 * i + k}.0\n{k} {n} {i}.0 end {10 * i + 5}.0 0\n"
                for k, n in enumerate(pair)))
    return plan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tests/fakebw.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("-b", "--minbytes", default="1G")
    p.add_argument("-e", "--maxbytes", default="8G")
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-g", "--ngpus", type=int, default=1)
    p.add_argument("--nodes", help="hostlist of the nodes in the test (default: the step's)")
    args, _unknown = p.parse_known_args(argv)  # accept the rest of nccl-tests' options
    nodelist = args.nodes or os.environ.get("SLURM_STEP_NODELIST") or os.environ.get(
        "SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    nodes = expand(nodelist)
    me = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    rates = bandwidth_map()
    default = float(os.environ.get("SLURMFABRIC_FAKEBW_DEFAULT", "360"))
    peak = min(rates.get(n, default) for n in nodes)
    time.sleep(float(os.environ.get("SLURMFABRIC_FAKEBW_SECONDS", "1")))
    if int(os.environ.get("SLURM_PROCID", "0")) != 0:
        return 0
    ntasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", str(len(nodes))))
    sys.stdout.write(render(
        nodes, peak, parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor,
        ranks_per_node=max(1, ntasks // len(nodes)), pid=os.getpid(),
    ))
    sys.stdout.write(f"# fakebw: ran on {me} for {','.join(nodes)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
