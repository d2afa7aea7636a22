"""What the network costs a training step: a small analytical model, and the fault it hides.

Step time = compute + the communication the backward pass does not hide. Standard library
only; every constant below carries its source (tests/fixtures/whatif/REFERENCES.md holds
the quotes and URLs, and tests/unit/test_whatif.py holds the model to them).

Compute per GPU: FLOPs per token x tokens per GPU / achieved FLOP/s. FLOPs per token is
6N (Kaplan et al. 2020, "Scaling Laws for Neural Language Models": forward 2N, backward 4N)
plus attention's 12 L H S (Chowdhery et al. 2022, PaLM, appendix B) when the shape is known.

Communication (one collective's time, per algorithm and size: collectives.py): NCCL's bus
bandwidth definitions (nccl-tests doc/PERFORMANCE.md): a
collective of S bytes over n ranks takes S x f / busbw, with f = 2(n-1)/n for all_reduce
and (n-1)/n for all_gather and reduce_scatter. Data parallel all-reduces the gradients;
sharded (FSDP/ZeRO-3) all-gathers the parameters twice (forward, backward) and
reduce-scatters the gradients. The bus bandwidth:

- one node: NVLink, measured ``all_reduce`` busbw (``NVLINK_BUSBW``);
- several nodes, ring: NCCL runs one ring per NIC, each crossing every node once, so the
  busbw is the node's NIC count x the per-NIC effective rate, capped by NVLink's ring
  figure: H100 + 8 x 400G NDR gives min(370, 8 x 48) = 370 GB/s (NVIDIA: "up to ~396GB/s
  with the RING protocol"); A100 + 8 x 200G HDR gives 8 x 24 = 192 GB/s (NVIDIA: 192);
- the ring goes as fast as its slowest hop, and NCCL splits the data evenly over its rings,
  so one NIC at half rate halves every node's share: busbw = NICs x the slowest NIC's rate;
  three 400G links and one 200G link make a 200G ring;
- RoCE: the IB figure x ``ROCE_FACTOR``; TCP (NCCL_NET=Socket over the front-end NIC): its
  line rate x ``TCP_EFFICIENCY`` (4-6 GB/s on 100 GbE, NVIDIA/nccl#450);
- GPUDirect RDMA off: each NIC's traffic bounces through host memory over the PCIe
  switch's uplink that two GPUs and two NICs share on HGX boards (``gdr_off_rate``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slurmfabric.whatif import memory
from slurmfabric.whatif.links import (  # noqa: F401 - model.X stays valid for callers
    EFA_FACTOR,
    GPUS_PER_SWITCH,
    IB_EFFICIENCY,
    NO_PFC_RATE,
    NVLINK_BUSBW,
    PCIE_UPLINK_GBS,
    ROCE_FACTOR,
    TCP_EFFICIENCY,
    gdr_off_rate,
    nic_rate_gbs,
    rails_busbw,
)

# Dense BF16 peak per GPU, FLOP/s (NVIDIA H100 / A100 datasheets: 989.4 and 312 TFLOP/s;
# H200 has the H100's tensor cores; B200: HGX B200's 36 PFLOP/s sparse FP16/BF16 for 8 GPUs,
# halved for dense: 2.25 PFLOP/s).
PEAK_FLOPS = {"h100": 989.4e12, "h200": 989.4e12, "a100": 312e12, "b200": 2250e12}
# Attention FLOPs need the shape; known models (Llama 3 paper; GPT-3 paper).
MODELS = {
    "llama3-8b": {"params": 8.03e9, "layers": 32, "hidden": 4096},
    "llama3-70b": {"params": 70.6e9, "layers": 80, "hidden": 8192},
    "llama3-405b": {"params": 405.8e9, "layers": 126, "hidden": 16384},
    "gpt3-175b": {"params": 175e9, "layers": 96, "hidden": 12288},
}
FABRICS = ("ib", "roce", "tcp", "efa")


@dataclass(frozen=True)
class Job:
    params: float
    nodes: int = 1
    gpus_per_node: int = 8
    fabric: str = "ib"
    port_rate: float = 400.0  # Gb/s per NIC
    nics: int | None = None  # per node; default one per GPU
    frontend_rate: float = 100.0  # Gb/s of the NIC TCP uses
    gpu: str = "h100"
    mfu: float = 0.4  # achieved / peak FLOP/s
    tokens_per_gpu: int = 8192  # per step (micro-batches x sequence)
    seq: int = 8192
    layers: int | None = None
    hidden: int | None = None
    sharded: bool = True  # FSDP/ZeRO-3 (a 70B model does not fit data-parallel)
    grad_bytes: int = 2  # bf16
    overlap: float = 0.5  # share of the compute time communication can hide behind
    # faults
    slow_link: tuple[str, float] | None = None  # (node, fraction of its rate) on one NIC
    slow_gpu: tuple[str, int, float] | None = None  # (node, gpu, fraction of its clocks)
    gdr: bool = True
    no_pfc: str | None = None  # RoCE: the node whose switch hop has no PFC
    # 3D parallelism: tensor parallel inside a node, pipeline stages across nodes, data
    # parallel over the rest (Megatron-LM's order)
    tp: int = 1
    pp: int = 1
    nodelist: tuple[str, ...] = ()  # the nodes' names; () = any name numbered 0..nodes

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return max(1, self.ranks // (self.tp * self.pp))

    @property
    def microbatches(self) -> float:
        """Sequences one pipeline runs per step: each GPU's tokens, times the GPUs that
        share one copy of the model, in sequences of ``seq`` tokens."""
        return max(1.0, self.tokens_per_gpu * self.tp * self.pp / self.seq)

    @property
    def nic_count(self) -> int:
        return self.nics or self.gpus_per_node


@dataclass(frozen=True)
class Step:
    seconds: float
    compute: float
    comm: float  # the collectives' whole time
    exposed: float  # what the overlap does not hide
    busbw: float  # GB/s the data-parallel collectives run at
    limit: str  # what sets the busbw
    tp_comm: float = 0.0  # tensor parallel all-reduces (on the critical path)
    pp_comm: float = 0.0  # pipeline sends between stages (on the critical path)
    bubble: float = 0.0  # the pipeline's fill and drain, idle

    def to_dict(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in vars(self).items()}


def flops_per_token(job: Job) -> float:
    attention = 12 * job.layers * job.hidden * job.seq if job.layers and job.hidden else 0
    return 6 * job.params + attention


def busbw(job: Job, algo: str = "ring") -> tuple[float, str]:
    """(GB/s, what limits it): the large-message all_reduce busbw of ``algo`` (ring by
    default: what nccl-tests with NCCL_ALGO=Ring and pairs measure)."""
    from slurmfabric.whatif import collectives

    bw = collectives.algorithms(job)[algo][0]
    if job.nodes == 1:
        return bw, f"NVLink{' SHARP' if algo == 'nvls' else ''} (one node)"
    rails, why = rails_busbw(job)
    if algo == "ring" and bw < rails:
        return bw, "NVLink ring inside each node"
    return bw, why if algo == "ring" else f"{algo} over {why}"


# PyTorch DDP's default gradient bucket (torch.nn.parallel.DistributedDataParallel,
# bucket_cap_mb=25): data parallel all-reduces the gradients in pieces of this size.
DDP_BUCKET_BYTES = 25 * 2**20


def collective_list(job: Job) -> list[tuple[str, float, int]]:
    """(op, bytes of the collective's array, how many) one step runs: sharded training
    all-gathers each unit's parameters twice and reduce-scatters its gradients (one FSDP unit
    per layer when the shape is known, else one for the model); data parallel all-reduces
    the gradients bucket by bucket."""
    if job.ranks == 1:
        return []
    grads = job.params * job.grad_bytes
    if job.sharded:
        units = job.layers or 1
        return [("all_gather", job.params * 2 / units, 2 * units),
                ("reduce_scatter", grads / units, units)]
    full, rest = divmod(grads, DDP_BUCKET_BYTES)
    out = [("all_reduce", float(DDP_BUCKET_BYTES), int(full))] if full else []
    return out + ([("all_reduce", rest, 1)] if rest else [])


def dp_view(job: Job) -> Job:
    """The data-parallel group as a job of its own: the GPUs with the same tensor and
    pipeline rank, ``gpus_per_node / tp`` of them on each node (tensor parallel stays inside
    a node), each holding 1/(tp x pp) of the parameters and its stage's layers. Every group
    runs at once, so each gets its share of the node's NICs."""
    if job.tp * job.pp == 1:
        return job
    per_node = max(1, min(job.dp, job.gpus_per_node // job.tp))
    share = per_node / job.gpus_per_node
    return replace(job, nodes=max(1, job.dp // per_node), gpus_per_node=per_node,
                   nics=max(1, round(job.nic_count * share)),
                   frontend_rate=job.frontend_rate * share,
                   params=job.params / (job.tp * job.pp),
                   layers=max(1, job.layers // job.pp) if job.layers else None, tp=1, pp=1)


def model_parallel_comm(job: Job) -> tuple[float, float]:
    """(tensor-parallel seconds, pipeline seconds) per step, both on the critical path.

    Tensor parallel all-reduces each layer's activations twice forward and twice backward
    (Shoeybi et al. 2019, Megatron-LM, section 3: "two all-reduce operations in the forward
    pass and two in the backward pass"), s x h bf16 values per micro-batch, inside the node
    over NVLink. A pipeline sends each micro-batch's activations forward and their gradients
    back across each stage boundary, s x h / tp bf16 values per GPU with the scatter/gather
    optimisation (Narayanan et al. 2021, section 4.1), over the GPU's share of the NICs when
    stages sit on different nodes."""
    from slurmfabric.whatif import collectives

    if job.tp * job.pp == 1 or not (job.layers and job.hidden):
        return 0.0, 0.0
    m = job.microbatches
    activation = job.seq * job.hidden * 2.0
    tp_s = 0.0
    if job.tp > 1:
        inside = replace(job, nodes=1, gpus_per_node=job.tp, tp=1, pp=1, slow_link=None)
        one, _ = collectives.best(inside, "all_reduce", activation)
        tp_s = one * 4 * (job.layers / job.pp) * m
    pp_s = 0.0
    if job.pp > 1 and job.nodes > 1:
        per_gpu = (nic_rate_gbs(job, job.frontend_rate) if job.fabric == "tcp"
                   else job.nic_count * nic_rate_gbs(job, job.port_rate)) / job.gpus_per_node
        if job.slow_link:  # the stage boundary that crosses the slow NIC sets the pace
            per_gpu *= job.slow_link[1]
        hop = collectives.NET_HOP_US * 1e-6 + activation / job.tp / (per_gpu * 1e9)
        pp_s = 2 * m * hop
    return tp_s, pp_s


def comm_bytes(job: Job) -> float:
    """Bus bytes per rank per step: S x NCCL's factor, summed over the collectives."""
    from slurmfabric.whatif.collectives import factor

    return sum(size * factor(op, job.ranks) * count for op, size, count in collective_list(job))


def step(job: Job) -> Step:
    from slurmfabric.whatif import collectives

    peak = PEAK_FLOPS.get(job.gpu, PEAK_FLOPS["h100"]) * job.mfu
    compute = flops_per_token(job) * job.tokens_per_gpu / peak
    if job.slow_gpu:  # synchronous data parallel: everyone waits for the slowest GPU
        compute /= job.slow_gpu[2]
    # 1F1B's fill and drain: (pp - 1) / m of the compute (Narayanan et al. 2021, section 2.2)
    bubble = compute * (job.pp - 1) / job.microbatches
    group = dp_view(job)
    comm, main, largest = 0.0, "ring", -1.0
    for op, size, count in collective_list(group):
        seconds, algo = collectives.best(group, op, size)
        comm += seconds * count
        if size * count > largest:
            main, largest = algo, size * count
    bw = comm_bytes(group) / comm / 1e9 if comm else busbw(group)[0]
    limit = busbw(group, main)[1] if group.ranks > 1 else busbw(group)[1]
    tp_s, pp_s = model_parallel_comm(job)
    exposed = max(0.0, comm - job.overlap * compute) + tp_s + pp_s
    return Step(compute + bubble + exposed, compute, comm + tp_s + pp_s, exposed, bw,
                f"{main}: {limit}", tp_s, pp_s, bubble)


def efficiency(job: Job) -> float:
    """Weak scaling: a healthy node's step time over this job's (the same work per GPU):
    the share of the GPUs' throughput the network and the faults leave. The node keeps the
    tensor-parallel degree and runs no pipeline (one node holds one stage)."""
    one = replace(healthy(job), nodes=1, pp=1, nodelist=())
    return step(one).seconds / step(job).seconds


def node_known(job: Job, name: str) -> bool:
    """Is ``name`` one of the job's nodes? With a nodelist, a member of it; without one, a
    name whose trailing number is 0..nodes (gpu007 in a 16-node job, not gpu999)."""
    if job.nodelist:
        return name in job.nodelist
    digits = len(name) - len(name.rstrip("0123456789"))
    return bool(digits) and int(name[-digits:]) <= job.nodes


def check(job: Job) -> None:
    """Refuse, in one ValueError naming the option, a job the model cannot stand for: a fault
    on a node or GPU the job does not have, a parallel layout the GPUs cannot hold."""
    check_faults(job)
    check_layout(job)


def check_faults(job: Job) -> None:
    names = (f"the job's nodes are {job.nodelist[0]}..{job.nodelist[-1]}" if job.nodelist
             else f"name a node numbered 0-{job.nodes}, or the nodes with --nodelist")
    for flag, node in (("--halve-cable", job.slow_link[0] if job.slow_link else None),
                       ("--slow-gpu", job.slow_gpu[0] if job.slow_gpu else None),
                       ("--no-pfc", job.no_pfc)):
        if node is not None and not node_known(job, node):
            raise ValueError(f"{flag} {node}: no such node in a {job.nodes}-node job; {names}")
    if job.slow_gpu and not 0 <= job.slow_gpu[1] < job.gpus_per_node:
        raise ValueError(f"--slow-gpu: GPU {job.slow_gpu[1]} does not exist on a node of "
                         f"{job.gpus_per_node} GPUs (0-{job.gpus_per_node - 1})")


def check_layout(job: Job) -> None:
    if job.tp < 1 or job.pp < 1:
        raise ValueError("--tp and --pp are 1 or more")
    if job.tp > job.gpus_per_node or job.gpus_per_node % job.tp:
        raise ValueError(f"--tp {job.tp}: tensor parallel runs inside a node over NVLink, so "
                         f"it divides --gpus-per-node {job.gpus_per_node}")
    if job.ranks % (job.tp * job.pp):
        raise ValueError(f"--tp {job.tp} x --pp {job.pp} does not divide the job's "
                         f"{job.ranks} GPUs")
    if job.tp * job.pp > 1 and not (job.layers and job.hidden):
        raise ValueError("--tp/--pp need the model's layers and width: use --model")
    if job.layers and job.pp > job.layers:
        raise ValueError(f"--pp {job.pp}: more stages than the model's {job.layers} layers")


def healthy(job: Job) -> Job:
    return replace(job, slow_link=None, slow_gpu=None, gdr=True, no_pfc=None)


def sweep(job: Job, node_counts: list[int], fabrics: tuple[str, ...] = FABRICS
          ) -> list[dict]:
    rows = []
    for fabric in fabrics:
        for nodes in node_counts:
            here = replace(job, fabric=fabric, nodes=nodes, nodelist=())
            try:
                check_layout(here)
            except ValueError:
                continue  # tp x pp does not divide this node count's GPUs
            result = step(here)
            rows.append({"fabric": fabric, "nodes": nodes, "step_s": result.seconds,
                         "busbw": result.busbw, "efficiency": efficiency(here),
                         "tokens_per_s": here.tokens_per_gpu * here.ranks / result.seconds,
                         "fits": memory.footprint(here).fits})
    return rows


def sweep_rows(job: Job) -> list[dict]:
    """The ``--sweep`` table: the healthy job over 1, 2, 4 ... nodes on every fabric, then,
    when the job carries a fault, the faulty job on its own fabric (labelled ``+fault``)."""
    rows = sweep(healthy(job), powers(job.nodes))
    if job.slow_link or job.slow_gpu or not job.gdr or job.no_pfc:
        rows += [dict(r, fabric=f"{r['fabric']}+fault") for r in sweep(
            job, [n for n in powers(job.nodes) if n > 1], (job.fabric,))]
    return rows


# Published runs spread about 10 % below the NIC-bound figure (REFERENCES.md T9: 350-396
# GB/s for 8 x 400G): the band nccl-tests parse and pairs report accept.
BUSBW_TOLERANCE = 0.10


def nic_bound_busbw(rates_gbps: list[float], fabric: str = "ib") -> float:
    """What a node's rails should carry for a multi-node ring when the GPU is not known:
    the rail count x one healthy rail's effective rate (the fastest rail: a slower one is
    the fault to find, not the expectation)."""
    if not rates_gbps:
        raise ValueError("no NIC rates")
    job = Job(params=1.0, fabric=fabric)
    return len(rates_gbps) * nic_rate_gbs(job, max(rates_gbps))


def expected_busbw(rates_gbps: list[float], fabric: str = "ib", nodes: int = 2,
                   gpu: str = "h100", gdr: bool = True) -> float:
    """The large-message all_reduce busbw a fabric should reach (what nccl-tests parse and
    pairs report compare measurements with): the slowest rail x the rail count."""
    if not rates_gbps:
        raise ValueError("no NIC rates")
    job = Job(params=1.0, nodes=nodes, gpus_per_node=len(rates_gbps), fabric=fabric,
              port_rate=min(rates_gbps), nics=len(rates_gbps), gpu=gpu, gdr=gdr)
    return busbw(job)[0]


# What reveals each fault: slurmfabric's own commands with the line they print, then the
# underlying tool and what it shows.
FINDERS = {
    "slow_link": [
        ("slurmfabric pairs submit --nodes NODES --results DIR; slurmfabric pairs report DIR",
         "every pair with {node} is at 50 % (...): suspect {node}'s NIC or cable"),
        ("slurmfabric ib audit", "link-degraded ... {node} HCA-.../1 <-> ...: active width or "
         "speed below what both ends support"),
        ("slurmfabric roce audit --nodes NODES --results DIR (RoCE)",
         "{node} ... (majority ...): the port that differs"),
        ("ibstat (on {node})", "Rate: 200 on one port where the others say 400"),
        ("perfquery -x LID PORT (on {node})", "SymbolErrorCounter / LinkDownedCounter rising"),
        ("ethtool IF (on {node}, RoCE/Ethernet)", "Speed: 200000Mb/s on one port"),
    ],
    "slow_gpu": [
        ("slurmfabric health check", "gpu.throttle: GPU{gpu} HW slowdown (or HW thermal / "
         "power brake)"),
        ("nvidia-smi -q -d PERFORMANCE,CLOCK (the GPU clock check, on {node})",
         "GPU {gpu}: Clocks Event Reasons HW Slowdown Active; SM clock below its peers'"),
    ],
    "no_gdr": [
        ("slurmfabric health check", "rdma.gdr: no GPUDirect RDMA: ..."),
        ("slurmfabric nccl-log LOG", "gdr_off: ... uses NET/IB without GPUDirect RDMA (...)"),
        ("lsmod | grep nvidia_peermem (on {node})", "nothing: the peer-memory module is not "
         "loaded"),
    ],
    "no_pfc": [
        ("slurmfabric roce audit --nodes NODES --results DIR",
         "{node} pfc ... (majority ...): the port that differs"),
        ("slurmfabric pairs submit --nodes NODES --results DIR; slurmfabric pairs report DIR",
         "the pairs through {node}'s hop are low and vary run to run"),
        ("ethtool -S IF | grep -E 'pause|discard|out_of_sequence' (on {node})",
         "rx_prio3_pause 0 while rx_discards_phy / out_of_sequence climb"),
    ],
    "tcp": [
        ("slurmfabric nccl-log LOG", "socket_fallback: ... uses NET/Socket: NET/IB found no "
         "device"),
        ("slurmfabric topo --explain", "the plan's NCCL_NET and the rails it found"),
    ],
}


def faults(job: Job) -> list[dict]:
    """Each fault the job sets, with the step time it costs and how to find it."""
    base_step = step(healthy(job))
    base = base_step.seconds
    well = healthy(job)
    out = []
    for name, changed, kind, node in (
            (f"one NIC of {job.slow_link[0]} at {job.slow_link[1]:g} of its rate"
             if job.slow_link else "", replace(well, slow_link=job.slow_link), "slow_link",
             job.slow_link[0] if job.slow_link else ""),
            (f"GPU {job.slow_gpu[1]} of {job.slow_gpu[0]} at {job.slow_gpu[2]:g} of its "
             "clocks" if job.slow_gpu else "", replace(well, slow_gpu=job.slow_gpu),
             "slow_gpu", job.slow_gpu[0] if job.slow_gpu else ""),
            ("GPUDirect RDMA off" if not job.gdr else "", replace(well, gdr=False), "no_gdr",
             "NODE"),
            (f"{job.no_pfc}'s RoCE hop without PFC" if job.no_pfc else "",
             replace(well, no_pfc=job.no_pfc), "no_pfc", job.no_pfc or "")):
        if not name:
            continue
        result = step(changed)
        seconds = result.seconds
        gpu = job.slow_gpu[1] if job.slow_gpu else 0
        out.append({"fault": name, "kind": kind, "step_s": seconds, "lost": 1 - base / seconds,
                    "comm_s": result.comm, "healthy_comm_s": base_step.comm,
                    "busbw": result.busbw, "healthy_busbw": base_step.busbw,
                    "find": [(cmd.format(node=node, gpu=gpu), line.format(node=node, gpu=gpu))
                             for cmd, line in FINDERS[kind]]})
    return out


def cost(job: Job, price_per_gpu_hour: float) -> dict[str, float]:
    """What the job's GPU-hours buy: the price of a step and of a useful PFLOP (the model's
    6N + attention FLOPs, not recomputation or idle time), against the same FLOP at perfect
    scaling. At a scaling efficiency e a useful FLOP costs 1/e as much: 60 % costs 67 % more.
    A fault's daily cost is the share of the GPU-hours it wastes (faults()' ``lost``)."""
    result = step(job)
    per_hour = job.ranks * price_per_gpu_hour
    per_step = per_hour * result.seconds / 3600
    useful_pflop = flops_per_token(job) * job.tokens_per_gpu * job.ranks / 1e15
    eff = efficiency(job)
    return {"price_per_gpu_hour": price_per_gpu_hour, "per_hour": per_hour,
            "per_step": per_step, "per_useful_pflop": per_step / useful_pflop,
            "ideal_per_useful_pflop": per_step / useful_pflop * eff, "premium": 1 / eff - 1,
            "per_day": per_hour * 24}


def step_line(job: Job) -> str:
    result = step(job)
    return (f"{job.nodes} x {job.gpus_per_node} GPUs, {job.fabric}: step {result.seconds:.2f} s "
            f"(compute {result.compute:.2f} s, collectives {result.comm:.2f} s, exposed "
            f"{result.exposed:.2f} s at {result.busbw:.1f} GB/s busbw: {result.limit}); "
            f"scaling efficiency {100 * efficiency(job):.1f} %")


def powers(limit: int) -> list[int]:
    out, n = [], 1
    while n < limit:
        out.append(n)
        n *= 2
    return [*out, limit]

