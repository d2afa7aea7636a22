"""Per-local-rank choices: the GPU, the nearest rail NIC, the CPU set and the memory node.

CPUs start from the job's allowed CPUs (``sched_getaffinity``), intersected with the CPUs of
the GPU's NUMA node, then split by physical core among the ranks whose GPUs share that node
(sched_getaffinity(2); numa_node and local_cpulist in the kernel's
Documentation/ABI/testing/sysfs-bus-pci). With ``numa=off`` or ``numa_node`` -1 the GPU's
``local_cpulist`` is used instead, and an empty intersection falls back to all allowed CPUs,
with a warning.
"""

from __future__ import annotations

from slurmfabric._common.record import Record
from slurmfabric._common.sysfs import format_cpulist
from slurmfabric.topology.model import Gpu, RdmaPort, Topology, distance_rank


class RankBinding(Record):
    __slots__ = (
        "local_rank", "gpu", "visible_index", "nic", "nic_distance", "cpus", "mem_node", "reason"
    )  # fmt: skip
    local_rank: int
    gpu: Gpu | None
    visible_index: int | None  # the CUDA device number this rank should use
    nic: str | None  # "mlx5_0:1"
    nic_distance: str | None
    cpus: tuple[int, ...]
    mem_node: int | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "local_rank": self.local_rank,
            "gpu": None if self.gpu is None else self.gpu.index,
            "gpu_bus_id": None if self.gpu is None else self.gpu.bus_id,
            "visible_index": self.visible_index,
            "nic": self.nic,
            "nic_distance": self.nic_distance,
            "cpus": format_cpulist(list(self.cpus)),
            "mem_node": self.mem_node,
            "reason": self.reason,
        }


def resolve_gpus(topo: Topology, visible: list[str] | None, warnings: list[str]) -> list[Gpu]:
    """Map CUDA_VISIBLE_DEVICES / SLURM_STEP_GPUS entries to GPUs.

    Integers are device minors (Slurm's gres File=/dev/nvidiaN numbering) or, when the
    minor is unknown or an AMD render minor (File=/dev/dri/renderD128...), PCI-order
    indices; ``GPU-...`` strings are UUIDs; bus ids also work.
    """
    if visible is None:
        return list(topo.gpus)
    chosen: list[Gpu] = []
    for raw in visible:
        entry = raw.strip()
        if not entry:
            continue
        found = None
        for gpu in topo.gpus:
            if entry.isdigit():
                number = gpu.minor if gpu.minor is not None else gpu.index
                # an AMD GPU's minor is its render node (128 and up), which cannot be
                # confused with a position: Slurm may give either
                if int(entry) in (number, gpu.index if number >= 128 else -1):
                    found = gpu
            elif (gpu.uuid or "").lower().startswith(entry.lower()) or gpu.bus_id.endswith(
                entry.lower()[-12:]
            ):
                found = gpu
            if found:
                break
        if found is None:
            warnings.append(f"visible GPU {entry!r} matches no GPU found on this node")
        else:
            chosen.append(found)
    return chosen


def _split_by_core(
    cpus: set[int], parts: int, siblings: dict[int, tuple[int, ...]]
) -> list[tuple[int, ...]]:
    cores: dict[int, list[int]] = {}
    for cpu in sorted(cpus):
        group = [c for c in siblings.get(cpu, (cpu,)) if c in cpus] or [cpu]
        cores.setdefault(min(group), [])
        if cpu not in cores[min(group)]:
            cores[min(group)].append(cpu)
    ordered = [cores[k] for k in sorted(cores)]
    if parts <= 1 or len(ordered) < parts:
        return [tuple(sorted(cpus))] * max(parts, 1)
    size, extra = divmod(len(ordered), parts)
    chunks: list[tuple[int, ...]] = []
    start = 0
    for part in range(parts):
        end = start + size + (1 if part < extra else 0)
        chunks.append(tuple(sorted(c for core in ordered[start:end] for c in core)))
        start = end
    return chunks


def place_ranks(
    topo: Topology,
    local_world_size: int,
    rails: list[RdmaPort],
    allowed: tuple[int, ...],
    visible: list[str] | None,
    warnings: list[str],
) -> list[RankBinding]:
    gpus = resolve_gpus(topo, visible, warnings)
    if gpus and local_world_size > len(gpus):
        warnings.append(
            f"{local_world_size} local ranks but {len(gpus)} visible GPUs: ranks share GPUs"
        )
    allowed_set = set(allowed)
    rank_gpu: list[tuple[Gpu | None, int | None]] = [
        (gpus[r % len(gpus)], r % len(gpus)) if gpus else (None, None)
        for r in range(local_world_size)
    ]

    # CPU source per rank, then split each source among the ranks sharing it.
    sources: list[tuple[frozenset[int], int | None, str]] = []
    warned_local = False
    for rank, (gpu, _) in enumerate(rank_gpu):
        base: set[int] = set()
        mem: int | None = None
        what = "the job's allowed CPUs"
        if gpu is not None and gpu.numa_node is not None and topo.numa_cpus(gpu.numa_node):
            base = set(topo.numa_cpus(gpu.numa_node)) & allowed_set
            mem, what = gpu.numa_node, f"NUMA node {gpu.numa_node}"
        elif gpu is not None and gpu.pci.local_cpus:
            base = set(gpu.pci.local_cpus) & allowed_set
            what = "the GPU's local_cpulist"
            if not warned_local:
                warned_local = True
                warnings.append(
                    "GPU numa_node is -1 (numa=off or no firmware affinity): CPUs come from "
                    "local_cpulist and memory is not bound"
                )
        if gpu is not None and not base:
            warnings.append(
                f"rank {rank}: none of the CPUs near GPU {gpu.index} ({what}) are in the job's "
                f"allowed CPUs {format_cpulist(allowed)}; using all allowed CPUs"
            )
            mem, what = None, "the job's allowed CPUs"
        sources.append((frozenset(base or allowed_set), mem, what))

    groups: dict[frozenset[int], list[int]] = {}
    for rank, (cpus, _, _) in enumerate(sources):
        groups.setdefault(cpus, []).append(rank)
    rank_cpus: dict[int, tuple[int, ...]] = {}
    for cpus, ranks in groups.items():
        for rank, chunk in zip(
            ranks, _split_by_core(set(cpus), len(ranks), dict(topo.cpu_siblings))
        ):
            rank_cpus[rank] = chunk

    nic_load: dict[str, int] = {}
    bindings: list[RankBinding] = []
    for rank, (gpu, vis) in enumerate(rank_gpu):
        nic, dist = None, None
        if gpu is not None and rails:

            def key(port: RdmaPort, gpu: Gpu = gpu) -> tuple[int, int]:
                dev = topo.device(port.device)
                return (distance_rank(topo.distance(gpu, dev)), nic_load.get(port.name, 0))

            best = min(rails, key=key)
            nic, dist = best.name, topo.distance(gpu, topo.device(best.device))
            nic_load[nic] = nic_load.get(nic, 0) + 1
        cpus, mem, what = rank_cpus[rank], sources[rank][1], sources[rank][2]
        share = len(groups[sources[rank][0]])
        parts = [f"GPU {gpu.index} ({gpu.bus_id})" if gpu else "no GPU"]
        if nic:
            parts.append(f"NIC {nic} ({dist})")
        parts.append(
            f"CPUs {format_cpulist(list(cpus))} from {what}"
            + (f" split {share} ways by core" if share > 1 else "")
        )
        parts.append(f"memory node {mem}" if mem is not None else "memory not bound")
        bindings.append(RankBinding(rank, gpu, vis, nic, dist, cpus, mem, "; ".join(parts)))
    return bindings
