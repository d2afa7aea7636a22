"""Does the job fit in its GPUs' memory? A what-if that lets a 405B model "run" on one 8-GPU
node prices a job nobody can start, so the model refuses it and says what would fit.

Per GPU, with mixed-precision Adam:
- model states: 16 bytes per parameter (bf16 weights 2 + bf16 gradients 2 + fp32 master
  weights, momentum and variance 12; Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
  Toward Training Trillion Parameter Models", section 3.1: "16Psi bytes"), divided over the
  tensor- and pipeline-parallel group, and over every rank when sharded (ZeRO-3/FSDP);
- activations with full recomputation (what a large model trains with): each of the GPU's
  layers keeps its input, 2 s h bytes per sequence (bf16), and the layer being recomputed
  holds its whole working set, 34 s h bytes (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", equation 1, s b h (34 + 5 a s / h), without
  the attention-score term that FlashAttention does not store), both split over the
  tensor-parallel group. One micro-batch of one sequence: gradient accumulation does not
  add to it.

The capacity is the whole HBM (datasheets below): the estimate leaves out the CUDA context,
NCCL's buffers and fragmentation, so a job refused here is certainly too big, and one that
passes near the limit may still not start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# HBM per GPU, GB: H100 SXM 80, H200 141 (NVIDIA H100/H200 datasheets), A100 80 (the 80 GB
# SXM part the lab's A100 nodes are), B200 180 (DGX B200: 1,440 GB for 8 GPUs).
GPU_MEMORY_GB = {"h100": 80.0, "h200": 141.0, "a100": 80.0, "b200": 180.0}
STATE_BYTES_PER_PARAM = 16
KEPT_INPUT_BYTES = 2  # per s x h element of each layer's input, bf16
WORKING_LAYER_BYTES = 34  # per s x h element of the layer being recomputed

# A whatif.model.Job (typed Any so model, which imports this, stays Job's only owner).
Job = Any


@dataclass(frozen=True)
class Footprint:
    states_gb: float
    activations_gb: float | None  # None: the model's shape (layers, hidden) is not known
    capacity_gb: float

    @property
    def total_gb(self) -> float:
        return self.states_gb + (self.activations_gb or 0.0)

    @property
    def fits(self) -> bool:
        return self.total_gb <= self.capacity_gb


def footprint(job: Job) -> Footprint:
    """What one GPU of ``job`` holds."""
    model_parallel = job.tp * job.pp
    share = job.ranks if job.sharded else model_parallel
    states = STATE_BYTES_PER_PARAM * job.params / share
    activations = None
    if job.layers and job.hidden:
        per_layer = job.seq * job.hidden / job.tp
        activations = (KEPT_INPUT_BYTES * job.layers / job.pp + WORKING_LAYER_BYTES) * per_layer
    return Footprint(states / 1e9, None if activations is None else activations / 1e9,
                     GPU_MEMORY_GB.get(job.gpu, GPU_MEMORY_GB["h100"]))


def fewest_nodes(job: Job) -> int | None:
    """The smallest node count at which a sharded job fits: the states shrink with the rank
    count, the activations do not (None: never, or data parallel, which keeps a whole copy
    per model-parallel group at any scale)."""
    if not job.sharded:
        return None
    got = footprint(job)
    room = got.capacity_gb - (got.activations_gb or 0.0)
    if room <= 0:
        return None
    gpus = STATE_BYTES_PER_PARAM * job.params / 1e9 / room
    nodes = max(1, math.ceil(gpus / job.gpus_per_node))
    while (nodes * job.gpus_per_node) % (job.tp * job.pp):
        nodes += 1
    return nodes


def refusal(job: Job) -> str | None:
    """One line saying why the job cannot fit and what would, or None when it fits."""
    got = footprint(job)
    if got.fits:
        return None
    parts = f"{got.states_gb:.0f} GB of weights, gradients and Adam states"
    if got.activations_gb is not None:
        parts += f" + {got.activations_gb:.0f} GB of activations (recomputed)"
    how = "sharded over every GPU" if job.sharded else "a whole copy per GPU (data parallel)"
    line = (f"the model does not fit: {parts} per GPU ({how}"
            + (f", tensor x pipeline parallel {job.tp} x {job.pp}" if job.tp * job.pp > 1
               else "") + f") against {got.capacity_gb:.0f} GB on a {job.gpu.upper()}")
    fewest = fewest_nodes(job)
    if fewest is not None:
        line += f"; it fits from --nodes {fewest}"
    elif not job.sharded:
        line += "; drop --data-parallel (shard it), or raise --tp/--pp"
    return line
