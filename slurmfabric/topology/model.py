"""The frozen snapshot that discovery returns and the plan reads.

Everything here is plain data (tuples, str, int, float) so a Topology can be compared,
serialised to JSON (``snapshot.py``) and rebuilt on a login node without the hardware.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# nvidia-smi topo -m names, nearest first. NCCL uses the same words for NCCL_NET_GDR_LEVEL
# and NCCL_P2P_LEVEL (NCCL env docs); NODE is nvidia-smi's "same NUMA node, different host
# bridge", which NCCL folds into PHB/SYS.
DISTANCES: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")


def distance_rank(name: str | None) -> int:
    """Order distances (PIX=0 ... SYS=4); unknown sorts last."""
    return DISTANCES.index(name) if name in DISTANCES else len(DISTANCES)


@dataclass(frozen=True)
class PciDevice:
    """One PCI function: its address, the bridge chain above it, and where it sits."""

    address: str  # "0000:18:00.0"
    path: tuple[str, ...]  # ("pci0000:17", "0000:17:01.0", ..., "0000:18:00.0")
    vendor: str | None = None  # "0x15b3"
    device: str | None = None
    pci_class: str | None = None  # "0x020700"
    numa_node: int | None = None  # None when the kernel says -1 (numa=off, unknown)
    local_cpus: tuple[int, ...] = ()
    physfn: str | None = None  # PF address when this is an SR-IOV virtual function

    @property
    def root(self) -> str:
        return self.path[0] if self.path else ""

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str  # eight colon-separated groups of four hex digits
    type: str | None  # "RoCE v2", "IB/RoCE v1"; None if unreadable
    ndev: str | None  # netdev name; None (EINVAL) when the GID has none

    @property
    def is_ipv4_mapped(self) -> bool:
        return self.gid.startswith("0000:0000:0000:0000:0000:ffff:")

    @property
    def is_link_local(self) -> bool:
        return self.gid.startswith("fe80:")

    @property
    def is_v2(self) -> bool:
        return (self.type or "").strip().lower() == "roce v2"

    @property
    def ipv4(self) -> str | None:
        if not self.is_ipv4_mapped:
            return None
        tail = self.gid.replace(":", "")[-8:]
        return ".".join(str(int(tail[i : i + 2], 16)) for i in range(0, 8, 2))


@dataclass(frozen=True)
class RdmaPort:
    device: str  # "mlx5_0"
    port: int
    state: str  # "ACTIVE", "INIT", "DOWN", ... ("UNKNOWN" if unreadable)
    phys_state: str  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None
    rate: str | None  # raw, e.g. "400 Gb/sec (4X NDR)"
    link_layer: str  # "InfiniBand", "Ethernet", "Unknown" (EFA)
    gids: tuple[Gid, ...] = ()
    netdev: str | None = None
    counters: Mapping[str, int | None] = field(default_factory=dict, hash=False)

    @property
    def name(self) -> str:
        """NCCL_IB_HCA spelling: ``dev:port``."""
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    pci: PciDevice | None
    ports: tuple[RdmaPort, ...]
    has_uverbs: bool
    node_type: str | None = None  # "1: CA"
    fw_ver: str | None = None

    @property
    def vendor(self) -> str | None:
        return self.pci.vendor if self.pci else None

    @property
    def numa_node(self) -> int | None:
        return self.pci.numa_node if self.pci else None

    @property
    def is_vf(self) -> bool:
        return bool(self.pci and self.pci.is_vf)

    @property
    def is_efa(self) -> bool:
        # Amazon's PCI vendor id; EFA ports also report link_layer "Unknown"
        # (rdma-core PR #884).
        return self.vendor == "0x1d0f"


@dataclass(frozen=True)
class NetDev:
    name: str
    operstate: str | None  # "up", "down", "unknown"
    carrier: int | None
    speed_mbps: int | None  # None when unreadable or -1 (no link)
    type: int | None  # ARPHRD: 1 Ethernet, 32 InfiniBand (IPoIB), 772 loopback
    address: str | None  # MAC / hardware address
    mtu: int | None
    pci_address: str | None  # None for virtual devices (bond, lo, veth)
    master: str | None  # the bond (or bridge) this device is enslaved to
    bond_slaves: tuple[str, ...] = ()  # non-empty when this device is a bond
    ipv4: tuple[str, ...] = ()  # "10.0.0.5/24"
    ipv6: tuple[str, ...] = ()

    @property
    def is_bond(self) -> bool:
        return bool(self.bond_slaves)


@dataclass(frozen=True)
class Gpu:
    index: int  # position in PCI bus order (nvidia-smi's default order)
    pci: PciDevice
    uuid: str | None = None
    name: str | None = None
    minor: int | None = None  # /dev/nvidiaN: what Slurm's gres File= and SLURM_STEP_GPUS use

    @property
    def bus_id(self) -> str:
        return self.pci.address

    @property
    def numa_node(self) -> int | None:
        return self.pci.numa_node


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class GdrSupport:
    """Whether GPUDirect RDMA can work: ``peermem``, ``dmabuf`` or ``none``, and why."""

    mode: str
    evidence: str


@dataclass(frozen=True)
class Route:
    """One IPv4 route from /proc/net/route (main table)."""

    iface: str
    destination: str
    mask: str
    gateway: str
    metric: int = 0


@dataclass(frozen=True)
class Topology:
    root: str
    rdma: tuple[RdmaDevice, ...] = ()
    netdevs: tuple[NetDev, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    numa: tuple[NumaNode, ...] = ()
    allowed_cpus: tuple[int, ...] = ()
    cpu_siblings: Mapping[int, tuple[int, ...]] = field(default_factory=dict, hash=False)
    gdr: GdrSupport = GdrSupport("none", "not checked")
    routes: tuple[Route, ...] = ()
    markers: Mapping[str, str] = field(default_factory=dict, hash=False)  # name -> file
    gpu_source: str = "sysfs"  # "nvml" or "sysfs"
    notes: tuple[str, ...] = ()  # things discovery could not read, for --explain

    # -- lookups -------------------------------------------------------------------------
    @property
    def ports(self) -> tuple[RdmaPort, ...]:
        return tuple(p for d in self.rdma for p in d.ports)

    def device(self, name: str) -> RdmaDevice | None:
        return next((d for d in self.rdma if d.name == name), None)

    def port(self, device: str, port: int = 1) -> RdmaPort | None:
        dev = self.device(device)
        if dev is None:
            return None
        return next((p for p in dev.ports if p.port == int(port)), None)

    def netdev(self, name: str) -> NetDev | None:
        return next((n for n in self.netdevs if n.name == name), None)

    def numa_cpus(self, node: int) -> tuple[int, ...]:
        return next((n.cpus for n in self.numa if n.id == node), ())

    def distance(
        self, a: PciDevice | Gpu | RdmaDevice | None, b: PciDevice | Gpu | RdmaDevice | None
    ) -> str:
        """nvidia-smi's word for the PCIe path between two devices (see ``pci.distance``)."""
        from slurmfabric.topology.pci import distance

        return distance(_pci_of(a), _pci_of(b))


def _pci_of(obj: PciDevice | Gpu | RdmaDevice | None) -> PciDevice | None:
    if obj is None or isinstance(obj, PciDevice):
        return obj
    return obj.pci
