"""NUMA nodes, CPUs this process may use, physical cores, GPUDirect RDMA support and the
marker files of cloud NCCL plugins."""

from __future__ import annotations

import os

from slurmfabric._common import sysfs as _sysfs
from slurmfabric.topology._io import Reader
from slurmfabric.topology.model import GdrSupport, NumaNode

NODE_DIR = "/sys/devices/system/node"
CPU_DIR = "/sys/devices/system/cpu"

# Any of these means the peer-memory client for GPUDirect RDMA is loaded: the files NCCL
# itself checks (src/transport/net_ib.cc, ncclIbGdrSupport).
PEERMEM_FILES = (
    "/sys/kernel/mm/memory_peers/nv_mem/version",  # nv_peer_mem (MLNX_OFED)
    "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "/sys/module/nvidia_peermem/version",  # nvidia-peermem shipped with the driver
)
NVIDIA_PEERMEM = "/sys/module/nvidia_peermem"
AMDGPU = "/sys/module/amdgpu"
NVIDIA_VERSION = "/proc/driver/nvidia/version"
# Every path discover_gdr checks for existence (rank/plancache.py re-checks them per load)
GDR_EXISTS = (*PEERMEM_FILES, NVIDIA_PEERMEM, AMDGPU)

# Cloud plugins that own the NCCL network configuration (paths as their docs use them).
MARKERS = {
    # NVIDIA's SHARP plugin for NCCL (nccl-rdma-sharp-plugins, shipped in HPC-X and DOCA):
    # its IBext transport is what CollNet runs on
    "sharp": (
        "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so",
        "/usr/lib/x86_64-linux-gnu/libnccl-net-sharp.so",
        "/usr/lib/aarch64-linux-gnu/libnccl-net-sharp.so",
    ),
    # GCP A3 Ultra / A4 (gIB): "source /usr/local/gib/scripts/set_nccl_env.sh"
    "gib": ("/usr/local/gib/scripts/set_nccl_env.sh",),
    # GCP A3 Mega (TCPXO / FasTrak): nccl-env-profile.sh next to the plugin
    "tcpxo": (
        "/var/lib/tcpxo/lib64/nccl-env-profile.sh",
        "/usr/local/nvidia/lib64/nccl-env-profile.sh",
    ),
    # AWS: aws-ofi-nccl installed by the DLAMI / EFA installer
    "aws-ofi-nccl": (
        "/opt/amazon/ofi-nccl/lib/libnccl-net.so",
        "/opt/aws-ofi-nccl/lib/libnccl-net.so",
    ),
}


def _cpulist(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(_sysfs.parse_cpulist(text))
    except ValueError:
        return ()


def discover_numa(reader: Reader) -> tuple[NumaNode, ...]:
    nodes: list[NumaNode] = []
    for entry in reader.listdir(NODE_DIR):
        if entry.startswith("node") and entry[4:].isdecimal():
            nodes.append(
                NumaNode(int(entry[4:]), _cpulist(reader.text(f"{NODE_DIR}/{entry}/cpulist")))
            )
    return tuple(sorted(nodes, key=lambda n: n.id))


def online_cpus(reader: Reader) -> tuple[int, ...]:
    return _cpulist(reader.text(f"{CPU_DIR}/online"))


def allowed_cpus(reader: Reader, fallback: tuple[int, ...]) -> tuple[int, ...]:
    """The job's CPUs: sched_getaffinity on the real node, Cpus_allowed_list in a fixture."""
    if reader.real_base == "/" and hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    for line in (reader.text("/proc/self/status") or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus = _cpulist(line.split(":", 1)[1])
            if cpus:
                return cpus
    return fallback


def cpu_siblings(reader: Reader, cpus: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """cpu -> the hyperthreads of its physical core (thread_siblings_list, sysfs ABI)."""
    result: dict[int, tuple[int, ...]] = {}
    for cpu in cpus:
        if cpu in result:
            continue  # siblings are symmetric: one read per physical core
        siblings = _cpulist(reader.text(f"{CPU_DIR}/cpu{cpu}/topology/thread_siblings_list"))
        siblings = siblings or (cpu,)
        for sibling in siblings:
            result.setdefault(sibling, siblings)
    return result


def _kernel_at_least(release: str | None, major: int, minor: int) -> bool:
    """``5.15.0-91-generic`` >= (5, 12)? Leading ``MAJOR.MINOR`` digits only."""
    head, dot, rest = (release or "").partition(".")
    minor_text = rest[: len(rest) - len(rest.lstrip("0123456789"))]
    if not dot or not head.isdecimal() or not minor_text:
        return False
    return (int(head), int(minor_text)) >= (major, minor)


def discover_gdr(reader: Reader) -> GdrSupport:
    for path in PEERMEM_FILES:
        if reader.exists(path):
            return GdrSupport("peermem", f"{path} exists")
    if reader.exists(NVIDIA_PEERMEM):
        return GdrSupport("peermem", f"{NVIDIA_PEERMEM} exists")
    driver = reader.text(NVIDIA_VERSION)
    release = reader.text("/proc/sys/kernel/osrelease")
    # DMA-BUF GPUDirect RDMA needs the open GPU kernel modules and Linux >= 5.12; no peer
    # module at all (NCCL's ncclIbDmaBufSupport): a peermem-only check fails healthy nodes.
    if driver and "Open Kernel Module" in driver and _kernel_at_least(release, 5, 12):
        return GdrSupport("dmabuf", f"open NVIDIA kernel module and kernel {release} (>= 5.12)")
    if driver is None and reader.exists(AMDGPU):
        # AMD: RCCL registers GPU memory through amdgpu's dma-buf exporter, which RDMA
        # drivers import since Linux 5.12 (ib_umem_dmabuf_get, drivers/infiniband/core)
        if _kernel_at_least(release, 5, 12):
            return GdrSupport("dmabuf", f"amdgpu loaded and kernel {release} (>= 5.12)")
        return GdrSupport("none", f"amdgpu with kernel {release}: dma-buf import needs >= 5.12")
    if driver is None:
        return GdrSupport("none", "no NVIDIA driver (/proc/driver/nvidia/version missing)")
    why = "proprietary kernel module" if "Open Kernel Module" not in driver else f"kernel {release}"
    return GdrSupport(
        "none",
        "no peer-memory module (nvidia_peermem / nv_peer_mem) and no DMA-BUF path "
        f"({why}); load nvidia-peermem",
    )


def discover_markers(reader: Reader) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, paths in MARKERS.items():
        for path in paths:
            if reader.exists(path):
                found[name] = path
                break
    return found
