"""The frozen snapshot that discovery returns and the plan reads.

Everything here is plain data (tuples, str, int, float) so a Topology can be compared,
serialised to JSON (``snapshot.py``) and rebuilt on a login node without the hardware.
The classes are ``Record``s, not dataclasses: this module is imported on every rank of a
GPU job, and ``dataclasses`` alone costs about 8 ms there (see ``slurmfabric._common.record``).
"""

from __future__ import annotations

from slurmfabric._common.record import Record

TYPE_CHECKING = False  # no typing at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

# nvidia-smi topo -m names, nearest first. NCCL uses the same words for NCCL_NET_GDR_LEVEL
# and NCCL_P2P_LEVEL (NCCL env docs); NODE is nvidia-smi's "same NUMA node, different host
# bridge", which NCCL folds into PHB/SYS.
DISTANCES: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")


def distance_rank(name: str | None) -> int:
    """Order distances (PIX=0 ... SYS=4); unknown sorts last."""
    return DISTANCES.index(name) if name in DISTANCES else len(DISTANCES)


# GPUs of NVIDIA's Grace superchips (GPU model names, nvidia-smi and /proc/driver/nvidia)
GRACE_SUPERCHIPS = ("GH200", "GB200", "GB300")

class PciDevice(Record):
    """One PCI function: its address, the bridge chain above it, and where it sits."""

    __slots__ = (
        "address", "path", "vendor", "device", "pci_class", "numa_node", "local_cpus", "physfn"
    )
    _defaults = {
        "vendor": None, "device": None, "pci_class": None, "numa_node": None,
        "local_cpus": (), "physfn": None,
    }  # fmt: skip
    address: str  # "0000:18:00.0"
    path: tuple[str, ...]  # ("pci0000:17", "0000:17:01.0", ..., "0000:18:00.0")
    vendor: str | None  # "0x15b3"
    device: str | None
    pci_class: str | None  # "0x020700"
    numa_node: int | None  # None when the kernel says -1 (numa=off, unknown)
    local_cpus: tuple[int, ...]
    physfn: str | None  # PF address when this is an SR-IOV virtual function

    @property
    def root(self) -> str:
        return self.path[0] if self.path else ""

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None


class Gid(Record):
    __slots__ = ("index", "gid", "type", "ndev")
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


class RdmaPort(Record):
    __slots__ = (
        "device", "port", "state", "phys_state", "rate_gbps", "rate", "link_layer", "gids",
        "netdev", "counters",
    )  # fmt: skip
    _defaults = {"gids": (), "netdev": None}
    _factories = {"counters": dict}
    _unhashed = ("counters",)
    device: str  # "mlx5_0"
    port: int
    state: str  # "ACTIVE", "INIT", "DOWN", ... ("UNKNOWN" if unreadable)
    phys_state: str  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None
    rate: str | None  # raw, e.g. "400 Gb/sec (4X NDR)"
    link_layer: str  # "InfiniBand", "Ethernet", "Unknown" (EFA)
    gids: tuple[Gid, ...]
    netdev: str | None
    counters: Mapping[str, int | None]

    @property
    def name(self) -> str:
        """NCCL_IB_HCA spelling: ``dev:port``."""
        return f"{self.device}:{self.port}"


class RdmaDevice(Record):
    __slots__ = ("name", "pci", "ports", "has_uverbs", "node_type", "fw_ver")
    _defaults = {"node_type": None, "fw_ver": None}
    name: str
    pci: PciDevice | None
    ports: tuple[RdmaPort, ...]
    has_uverbs: bool
    node_type: str | None  # "1: CA"
    fw_ver: str | None

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


class NetDev(Record):
    __slots__ = (
        "name", "operstate", "carrier", "speed_mbps", "type", "address", "mtu", "pci_address",
        "master", "bond_slaves", "ipv4", "ipv6", "vlan_id", "vlan_of",
    )  # fmt: skip
    _defaults = {"bond_slaves": (), "ipv4": (), "ipv6": (), "vlan_id": None, "vlan_of": None}
    name: str
    operstate: str | None  # "up", "down", "unknown"
    carrier: int | None
    speed_mbps: int | None  # None when unreadable or -1 (no link)
    type: int | None  # ARPHRD: 1 Ethernet, 32 InfiniBand (IPoIB), 772 loopback
    address: str | None  # MAC / hardware address
    mtu: int | None
    pci_address: str | None  # None for virtual devices (bond, lo, veth)
    master: str | None  # the bond (or bridge) this device is enslaved to
    bond_slaves: tuple[str, ...]  # non-empty when this device is a bond
    ipv4: tuple[str, ...]  # "10.0.0.5/24"
    ipv6: tuple[str, ...]
    vlan_id: int | None  # 802.1Q VLAN id when this is a VLAN device (/proc/net/vlan/config)
    vlan_of: str | None  # the device it tags (the VLAN's real device)

    @property
    def is_bond(self) -> bool:
        return bool(self.bond_slaves)

    @property
    def is_vlan(self) -> bool:
        return self.vlan_id is not None


class Gpu(Record):
    __slots__ = ("index", "pci", "uuid", "name", "minor")
    _defaults = {"uuid": None, "name": None, "minor": None}
    index: int  # position in PCI bus order (nvidia-smi's default order)
    pci: PciDevice
    uuid: str | None
    name: str | None
    minor: int | None  # /dev/nvidiaN: what Slurm's gres File= and SLURM_STEP_GPUS use

    @property
    def bus_id(self) -> str:
        return self.pci.address

    @property
    def numa_node(self) -> int | None:
        return self.pci.numa_node


class NumaNode(Record):
    __slots__ = ("id", "cpus")
    id: int
    cpus: tuple[int, ...]


class GdrSupport(Record):
    """Whether GPUDirect RDMA can work: ``peermem``, ``dmabuf`` or ``none``, and why."""

    __slots__ = ("mode", "evidence")
    mode: str
    evidence: str


class Route(Record):
    """One IPv4 route from /proc/net/route (main table)."""

    __slots__ = ("iface", "destination", "mask", "gateway", "metric")
    _defaults = {"metric": 0}
    iface: str
    destination: str
    mask: str
    gateway: str
    metric: int


class Topology(Record):
    __slots__ = (
        "root", "rdma", "netdevs", "gpus", "numa", "allowed_cpus", "cpu_siblings", "gdr",
        "routes", "markers", "gpu_source", "notes",
    )  # fmt: skip
    _defaults = {
        "rdma": (), "netdevs": (), "gpus": (), "numa": (), "allowed_cpus": (),
        "gdr": GdrSupport("none", "not checked"), "routes": (), "gpu_source": "sysfs",
        "notes": (),
    }  # fmt: skip
    _factories = {"cpu_siblings": dict, "markers": dict}
    _unhashed = ("cpu_siblings", "markers")
    root: str
    rdma: tuple[RdmaDevice, ...]
    netdevs: tuple[NetDev, ...]
    gpus: tuple[Gpu, ...]
    numa: tuple[NumaNode, ...]
    allowed_cpus: tuple[int, ...]
    cpu_siblings: Mapping[int, tuple[int, ...]]
    gdr: GdrSupport
    routes: tuple[Route, ...]
    markers: Mapping[str, str]  # name -> file
    gpu_source: str  # "nvml" or "sysfs"
    notes: tuple[str, ...]  # things discovery could not read, for --explain

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

    @property
    def cpuless_numa(self) -> tuple[int, ...]:
        """NUMA nodes without CPUs on a GPU node: GPU memory the CPU addresses coherently
        (Grace: each GPU's HBM over NVLink-C2C, Documentation/mm/numa.rst "memory-only
        nodes"); its GPUs reach NICs through the CPU, never a shared PCIe switch."""
        if not self.gpus:
            return ()
        return tuple(n.id for n in self.numa if not n.cpus)

    @property
    def coherent_gpus(self) -> str | None:
        """Why the GPUs reach the CPU coherently over NVLink-C2C (Grace superchips), or
        None. Either their HBM shows as CPU-less NUMA nodes, or, where it does not (a VM,
        or a driver in CDMM mode, vllm-project/vllm#39361), their model names a Grace
        superchip: /proc/driver/nvidia/gpus/*/information "Model: NVIDIA GB200". There
        the NIC is reached through the CPU by design and NCCL still takes GPUDirect RDMA
        through C2C (NVIDIA/nccl#1579; 2-node GB300 "InfiniBand GDR (4 rails)",
        nebius/nebius-solutions-library#1135)."""
        if not self.gpus:
            return None
        if self.cpuless_numa:
            from slurmfabric._common.sysfs import format_cpulist

            return (f"GPU memory is CPU-less NUMA nodes {format_cpulist(list(self.cpuless_numa))}"
                    " (coherent GPUs, e.g. Grace over NVLink-C2C)")
        models = sorted({g.name for g in self.gpus if g.name
                         and any(chip in g.name for chip in GRACE_SUPERCHIPS)})
        if models:
            return f"{', '.join(models)}: Grace superchip GPUs (coherent over NVLink-C2C)"
        return None

    def numa_cpus(self, node: int) -> tuple[int, ...]:
        return next((n.cpus for n in self.numa if n.id == node), ())

    def distance(
        self, a: PciDevice | Gpu | RdmaDevice | None, b: PciDevice | Gpu | RdmaDevice | None
    ) -> str:
        """nvidia-smi's word for the PCIe path between two devices (``pci_distance``)."""
        return pci_distance(_pci_of(a), _pci_of(b))


def _pci_of(obj: PciDevice | Gpu | RdmaDevice | None) -> PciDevice | None:
    if obj is None or isinstance(obj, PciDevice):
        return obj
    return obj.pci


def pci_distance(a: PciDevice | None, b: PciDevice | None) -> str:
    """PIX / PXB / PHB / NODE / SYS between two PCI functions, as ``nvidia-smi topo -m``.

    nvidia-smi: PIX = at most one PCIe bridge (a switch counts as one: its upstream port
    plus one downstream port per side), PXB = several bridges without the host bridge,
    PHB = through the host bridge, NODE = across host bridges in one NUMA node,
    SYS = across the SMP interconnect. Unknown NUMA on different root complexes is SYS:
    the conservative answer.
    """
    if a is None or b is None or not a.path or not b.path:
        return "SYS"
    if a.root != b.root:
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return "NODE"
        return "SYS"
    bridges_a, bridges_b = a.path[1:-1], b.path[1:-1]
    common = 0
    for x, y in zip(bridges_a, bridges_b):
        if x != y:
            break
        common += 1
    if a.path[-1] == b.path[-1]:
        return "PIX"
    if common == 0:
        return "PHB"
    extra_a, extra_b = len(bridges_a) - common, len(bridges_b) - common
    # Functions of one card (``.0``/``.1``) share their parent: 0 extra bridges each.
    # Two devices under one switch: 1 extra (their downstream port) each.
    if extra_a <= 1 and extra_b <= 1:
        return "PIX"
    return "PXB"
