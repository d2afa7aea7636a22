"""How long one NCCL collective takes: per algorithm, with a latency term and a size.

A collective of S bytes over n ranks takes ``latency + S x f / busbw`` (nccl-tests
doc/PERFORMANCE.md: f = 2(n-1)/n for all_reduce, (n-1)/n for all_gather and
reduce_scatter), and NCCL's tuner runs the algorithm that predicts the shortest time
(NVIDIA/nccl src/graph/tuning.cc). Small messages are latency-bound, so their bus bandwidth
collapses; large messages reach the algorithm's bandwidth:

- ring: one NVLink ring inside a node; across nodes the rails' bound (rails x the slowest
  rail's effective rate) capped by NVLink's ring figure. Latency grows linearly: 2(nodes-1)
  network steps for all_reduce, nodes-1 for all_gather and reduce_scatter.
- NVLS (NVLink SHARP, H100/H200/B200, one node): the switch reduces, ~30 % above the ring.
- tree / NVLSTree (all_reduce across nodes): NVLink (NVLS where the GPU has it) inside each
  node, a tree of nodes on the network; latency grows with log2(nodes). Two nodes send
  each one copy of the data both ways, so busbw = rails x 2(n-1)/n (above the NIC bound:
  NVIDIA, nccl#812 "two nodes Tree BusBW figures that exceed the theoretical limit of the
  network cards"); with more nodes an inner node forwards both ways, so busbw = rails x
  (n-1)/n, the ring's figure.

Two constants set the latency: ``LAT_BASE_US`` is fitted (the held-out figures are in
slurmfabric/whatif/calibration.json), ``NET_HOP_US`` is NCCL's own.
"""

from __future__ import annotations

import math
from typing import Any

from slurmfabric.whatif.links import NVLINK_BUSBW, rails_busbw

# A whatif.model.Job: typed Any, so that model (which imports this) stays the only owner
# of Job without an import circle.
Job = Any

# Fixed cost of one collective as nccl-tests times it (launch, synchronisation), in us:
# FITTED on the recorded 1-node H100 ring run's 1 MiB and 16 MiB rows (46.5 us and 126.6 us,
# tests/fixtures/whatif/nccl_tests_h100_1node_ring_together.txt); its larger rows are held out.
LAT_BASE_US = 44.0
# One network step of the Simple protocol, in us: NCCL's tuner constant (src/graph/tuning.cc,
# hwLat[NET] Simple = 14.0 for Ring and Tree). Taken as it is, not fitted.
NET_HOP_US = 14.0
# GPUs with NVLink SHARP in their NVSwitch (NCCL's NVLS algorithms).
NVLS_GPUS = frozenset({"h100", "h200", "b200"})
OPS = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


def factor(op: str, ranks: int) -> float:
    """nccl-tests' bus factor: bus bytes per byte of the collective's array."""
    return OPS[op] * (ranks - 1) / ranks if ranks > 1 else 0.0


def algorithms(job: Job, op: str = "all_reduce") -> dict[str, tuple[float, float]]:
    """{algorithm: (large-message busbw GB/s, latency us)} that NCCL can run for ``op``."""
    nvlink = NVLINK_BUSBW.get(job.gpu, NVLINK_BUSBW["h100"])
    nvls = job.gpu in NVLS_GPUS
    if job.nodes == 1:
        out = {"ring": (nvlink["ring"], LAT_BASE_US)}
        if nvls and op == "all_reduce":
            out["nvls"] = (nvlink["nvls"], LAT_BASE_US)
        return out
    rails = rails_busbw(job)[0]
    steps = OPS[op] * (job.nodes - 1)
    out = {"ring": (min(nvlink["ring"], rails), LAT_BASE_US + steps * NET_HOP_US)}
    if op == "all_reduce":
        n = job.ranks
        tree = rails * (2 * (n - 1) / n if job.nodes == 2 else (n - 1) / n)
        inside = nvlink["nvls" if nvls else "ring"]
        hops = 2 * math.ceil(math.log2(job.nodes))
        out["nvlstree" if nvls else "tree"] = (min(inside, tree),
                                               LAT_BASE_US + hops * NET_HOP_US)
    return out


def seconds(size: float, op: str, ranks: int, bw: float, latency_us: float) -> float:
    """One collective of ``size`` bytes: latency + bus bytes / bus bandwidth."""
    return latency_us * 1e-6 + size * factor(op, ranks) / (bw * 1e9)


def best(job: Job, op: str, size: float, algo: str | None = None) -> tuple[float, str]:
    """(seconds, algorithm) of the fastest algorithm for this size (NCCL's tuner), or of
    ``algo`` when given."""
    options = algorithms(job, op)
    if algo is not None:
        if algo not in options:
            raise ValueError(f"{algo} does not run {op} here (choices: {sorted(options)})")
        options = {algo: options[algo]}
    return min((seconds(size, op, job.ranks, bw, lat), name)
               for name, (bw, lat) in options.items())


def busbw_at(job: Job, op: str, size: float, algo: str | None = None) -> tuple[float, str]:
    """(busbw GB/s, algorithm) that nccl-tests would print for ``size`` bytes."""
    t, name = best(job, op, size, algo)
    return size * factor(op, job.ranks) / t / 1e9, name
