"""Fabric discovery: one frozen ``Topology`` snapshot of this node (or of a fixture tree).

``discover(root)`` reads sysfs/procfs under ``root`` (default: ``SLURMFABRIC_SYSFS_ROOT`` or
``/``). It uses the standard library only, because it runs on every rank; NVML is used
only on a real node and only if importable. Unreadable files never raise.
"""

from __future__ import annotations

import os

from slurmfabric._common import sysfs as _sysfs
from slurmfabric._common.record import replace
from slurmfabric.topology._io import Reader, as_root
from slurmfabric.topology.model import (
    DISTANCES,
    GdrSupport,
    Gid,
    Gpu,
    NetDev,
    NumaNode,
    PciDevice,
    RdmaDevice,
    RdmaPort,
    Route,
    Topology,
    distance_rank,
)

TYPE_CHECKING = False  # no typing/collections at run time: the per-rank path
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DISTANCES",
    "GdrSupport",
    "Gid",
    "Gpu",
    "NetDev",
    "NumaNode",
    "PciDevice",
    "RdmaDevice",
    "RdmaPort",
    "Route",
    "Topology",
    "discover",
    "discover_with_reader",
    "distance_rank",
]


def discover(
    root: str | os.PathLike[str] | _sysfs.Root | None = None,
    *,
    nvml: bool | None = None,
    plan_only: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Topology:
    """Snapshot this node. ``nvml=None`` uses NVML only on the real root with a driver.
    ``environ`` (default ``os.environ``) is where NCCL_TOPO_FILE is looked up.

    ``plan_only=True`` is for the per-rank path (``env``/``launch``): it skips the files the
    plan never reads (port counters, firmware, IB GID tables, link details of netdevs), so
    the plan comes out the same with about a third fewer reads; ``topo`` shows everything.
    """
    return discover_with_reader(Reader(as_root(root)), nvml=nvml, plan_only=plan_only,
                                environ=environ)


def _nccl_topo_tree(reader: Reader, gpus: tuple, rdma_devices: tuple,
                    markers: dict[str, str], notes: list[str],
                    environ: Mapping[str, str]) -> tuple[tuple, tuple]:
    """Where sysfs hides the PCIe tree (a VM), take it from the NCCL topology file."""
    from slurmfabric.topology import nccl_topo

    devices = [d for d in (*gpus, *rdma_devices) if d.pci and d.pci.path]
    if not gpus or not nccl_topo.hidden([d.pci.path for d in devices]):
        return gpus, rdma_devices
    markers["pcie_hidden"] = "1"
    found = nccl_topo.configured_file(reader, environ)
    if found is None:
        return gpus, rdma_devices
    path, where = found
    text = reader.text(path)
    table = nccl_topo.bridges(text) if text and len(text) < nccl_topo.MAX_BYTES else {}
    if not table:
        notes.append(f"NCCL topology file {path} (from {where}) is missing or not NCCL XML")
        return gpus, rdma_devices
    markers["nccl_topo_file"] = path
    markers["nccl_topo_source"] = where

    def placed(dev):
        entry = table.get(dev.pci.address) if dev.pci else None
        if entry is None:
            return dev
        bridge, numa_id = entry
        numa_node = dev.pci.numa_node if dev.pci.numa_node is not None else numa_id
        root = f"nccl-topo:cpu{numa_id}"
        path = (root, bridge, dev.pci.address) if bridge else (root, dev.pci.address)
        pci = replace(dev.pci, path=path, numa_node=numa_node)
        return replace(dev, pci=pci)

    return tuple(placed(g) for g in gpus), tuple(placed(d) for d in rdma_devices)


def discover_with_reader(
    reader: Reader, *, nvml: bool | None = None, plan_only: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Topology:
    from slurmfabric.topology import gpu, net, numa, rdma

    real_root = reader.real_base == "/"
    if nvml is None:
        nvml = real_root and os.path.exists("/dev/nvidiactl")
    routes = net.read_routes(reader)
    numa_nodes = numa.discover_numa(reader)
    online = numa.online_cpus(reader) or tuple(c for n in numa_nodes for c in n.cpus)
    allowed = numa.allowed_cpus(reader, online)
    gpus, gpu_source = gpu.discover_gpus(reader, use_nvml=bool(nvml))
    notes: list[str] = []
    if not reader.listdir("/sys"):
        where = os.path.join(reader.base, "sys")
        notes.append(f"{where} is missing or empty: is the root right?")
    rdma_devices = rdma.discover_rdma(reader, plan_only=plan_only)
    markers = numa.discover_markers(reader)
    gpus, rdma_devices = _nccl_topo_tree(reader, gpus, rdma_devices, markers, notes,
                                         os.environ if environ is None else environ)
    return Topology(
        root=str(reader.base),
        rdma=rdma_devices,
        netdevs=net.discover_netdevs(reader, routes, plan_only=plan_only),
        gpus=gpus,
        numa=numa_nodes,
        allowed_cpus=allowed,
        cpu_siblings=numa.cpu_siblings(reader, allowed),
        gdr=numa.discover_gdr(reader),
        routes=routes,
        markers=markers,
        gpu_source=gpu_source,
        notes=tuple(notes),
    )
