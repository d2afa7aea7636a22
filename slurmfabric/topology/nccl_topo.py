"""The PCIe tree a hypervisor hides, taken from the NCCL topology file the image ships.

On Hyper-V VMs (Azure ND A100 v4, ND H100 v5) every GPU and every NIC is alone in its own
PCI domain under the virtual bus (``.../VMBUS:00/<guid>/pci0101:00/0101:00:00.0``): sysfs
shows no PCIe switch, so every GPU-NIC pair looks equally far apart (NODE/SYS) and neither
NCCL nor the plan can pair GPU i with its NIC. The images therefore ship an NCCL topology
XML (``NCCL_TOPO_FILE``, set in ``/etc/nccl.conf`` on the Azure HPC images) in which each
GPU and its NIC sit under one synthetic bridge (``ffff:ff:01.0``) of a CPU (NUMA) node.

When sysfs hides the tree (every GPU and RDMA device directly under its own host bridge),
discovery reads that file (``NCCL_TOPO_FILE`` from the environment, else from
``/etc/nccl.conf``) and gives each device listed there the file's bridge as its parent, so
the usual distance rules (``model.pci_distance``) see GPU and NIC as PIX. The file's format is
NCCL's own (src/graph/xml.cc: ``<system>``, ``<cpu numaid>``, ``<pci busid class>``);
Azure's published files: github.com/Azure/azhpc-images topology/ndv4-topo.xml, ndv5-topo.xml.
"""

from __future__ import annotations

from slurmfabric.topology._io import Reader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

CONF = "/etc/nccl.conf"
MAX_BYTES = 1 << 20


def configured_file(reader: Reader, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(path, where it was set) of the NCCL topology file NCCL itself would read."""
    value = environ.get("NCCL_TOPO_FILE")
    if value:
        return value, "NCCL_TOPO_FILE"
    text = reader.text(CONF) or ""
    for line in text.splitlines():
        key, sep, rest = line.strip().partition("=")
        if sep and key.strip() == "NCCL_TOPO_FILE" and rest.strip():
            return rest.strip(), CONF
    return None


def bridges(xml_text: str) -> dict[str, tuple[str | None, int | None]]:
    """Device bus id -> (the bridge above it, or None when it hangs off the CPU itself;
    its CPU's NUMA id), from the XML (ND A100/H100 v5 pair each GPU and NIC under one
    bridge; ND v2 and NC A100 v4 list the devices directly under the CPU)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError:
        return {}
    out: dict[str, tuple[str | None, int | None]] = {}
    for cpu in root.iter("cpu"):
        numa_text = cpu.get("numaid")
        numa = int(numa_text) if numa_text and numa_text.isdigit() else None
        for bridge in cpu.findall("pci"):
            name = (bridge.get("busid") or "").lower()
            if not (bridge.get("class") or "").lower().startswith("0x0604"):
                if name:  # a device on the CPU's own root complex
                    out[name] = (None, numa)
                continue
            for child in bridge.iter("pci"):
                if child is bridge:
                    continue
                busid = (child.get("busid") or "").lower()
                if busid:
                    out[busid] = (name, numa)
    return out


def hidden(paths: list[tuple[str, ...]]) -> bool:
    """True when every device sits directly under its own host bridge (no bridge shown)."""
    return bool(paths) and all(len(p) == 2 for p in paths) and len({p[0] for p in paths}) > 1


def _affinity(cpus: tuple[int, ...] | list[int], ncpus: int) -> str:
    """NCCL's (and sysfs cpumap's) mask: 32-bit hex words, most significant first."""
    words = max(1, (max(ncpus, (max(cpus) + 1) if cpus else 1) + 31) // 32)
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    return ",".join(f"{(mask >> (32 * w)) & 0xFFFFFFFF:08x}" for w in range(words - 1, -1, -1))


def to_xml(topo) -> str:
    """NCCL's topology XML for ``topo``: CPUs (NUMA nodes) with their PCIe bridges, GPUs and
    NICs, nested as sysfs (or a topology file) shows them. For ``NCCL_TOPO_FILE`` on nodes
    where NCCL cannot read the tree itself; the layout follows NCCL's own dump
    (``NCCL_TOPO_DUMP_FILE``) and the files Azure ships (see the module docstring)."""
    from xml.sax.saxutils import quoteattr

    ncpus = max((c for n in topo.numa for c in n.cpus), default=-1) + 1
    numa_ids = [n.id for n in topo.numa] or [0]
    tree: dict[int, dict] = {i: {} for i in numa_ids}  # numa -> nested {bridge: {...}}
    leaves: list[tuple[int, tuple[str, ...], str, str]] = []
    for dev, kind in [*((g, "0x030200") for g in topo.gpus),
                      *((d, "0x020700") for d in topo.rdma)]:
        pci = dev.pci
        if pci is None or not pci.path:
            continue
        numa = pci.numa_node if pci.numa_node in tree else numa_ids[0]
        bridges = tuple(p for p in pci.path[1:-1] if not p.startswith("nccl-topo:"))
        node = tree[numa]
        for bridge in bridges:
            node = node.setdefault(bridge, {})
        leaves.append((numa, bridges, pci.address, (pci.pci_class or kind)[:8]))
    lines = ['<system version="1">']

    def emit(node: dict, path: tuple[str, ...], numa: int, depth: int) -> None:
        pad = "  " * depth
        for leaf_numa, bridges, address, cls in leaves:
            if leaf_numa == numa and bridges == path:
                lines.append(f'{pad}<pci busid={quoteattr(address)} class={quoteattr(cls)}/>')
        for bridge, child in node.items():
            lines.append(f'{pad}<pci busid={quoteattr(bridge)} class="0x060400">')
            emit(child, (*path, bridge), numa, depth + 1)
            lines.append(f"{pad}</pci>")

    for numa in numa_ids:
        cpus = next((n.cpus for n in topo.numa if n.id == numa), ())
        lines.append(f'  <cpu numaid="{numa}" affinity="{_affinity(cpus, ncpus)}">')
        emit(tree[numa], (), numa, 2)
        lines.append("  </cpu>")
    lines.append("</system>")
    return "\n".join(lines) + "\n"
