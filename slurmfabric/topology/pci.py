"""PCI functions from sysfs: the bridge chain above each device (distance: model.pci_distance).

A device's sysfs realpath is its bridge chain, e.g.
``/sys/devices/pci0000:3f/0000:3f:01.1/0000:40:00.0/.../0000:48:00.0`` (an OCI H100 node,
tests/fixtures/topology/nodes.py oci_nested):
``pci0000:3f`` is the host bridge (root complex), the first BDF its root port, then the
upstream/downstream ports of each PCIe switch, then the function itself. On Hyper-V VMs
(Azure ND/NC series) the host bridge hangs off the virtual bus, one PCI domain per device:
``/sys/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/<guid>/pci0001:00/0001:00:00.0``
(Linux drivers/pci/controller/pci-hyperv.c), so the function's attributes are read at its
real path, never at a path rebuilt from the chain.
"""

from __future__ import annotations

from slurmfabric._common import sysfs as _sysfs
from slurmfabric.topology._io import Reader
from slurmfabric.topology.model import PciDevice

_HEX = frozenset("0123456789abcdefABCDEF")


def _is_hex(text: str) -> bool:
    return all(c in _HEX for c in text)


def _is_bdf(part: str) -> bool:
    """``0000:18:00.0`` (domain:bus:device.function); plain string checks, no ``re``."""
    return (
        len(part) == 12
        and part[4] == ":"
        and part[7] == ":"
        and part[10] == "."
        and part[11] in "01234567"
        and _is_hex(part[:4] + part[5:7] + part[8:10])
    )


def _is_host_bridge(part: str) -> bool:
    """``pci0000:17``: the root complex directory under /sys/devices."""
    return len(part) == 10 and part.startswith("pci") and part[7] == ":" and _is_hex(
        part[3:7] + part[8:]
    )


def chain_from_path(real: str) -> tuple[str, ...]:
    """``/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0`` -> its host bridge and BDFs."""
    parts = [p for p in real.split("/") if p]
    chain: list[str] = []
    for part in parts:
        if _is_host_bridge(part):
            chain = [part]
        elif chain and _is_bdf(part):
            chain.append(part.lower())
        elif chain:
            break  # "infiniband", "net", ... below the function
    return tuple(chain)


def read_device(reader: Reader, sysfs_dir: str) -> PciDevice | None:
    """The PCI function whose sysfs directory (link or real path) is ``sysfs_dir``."""
    real = reader.realpath(sysfs_dir)
    chain = chain_from_path(real)
    if len(chain) < 2:
        return None  # virtual device (bond, veth) or no PCI host bridge above it
    end = real.find("/" + chain[-1])
    base = real[: end + 1 + len(chain[-1])] if end >= 0 else "/sys/devices/" + "/".join(chain)
    numa = reader.int(f"{base}/numa_node")
    # numa_node reads -1 when firmware gives no proximity info or the kernel runs with
    # numa=off (Documentation/ABI/testing/sysfs-bus-pci): treat as unknown.
    if numa is not None and numa < 0:
        numa = None
    physfn = None
    if reader.exists(f"{base}/physfn"):  # only SR-IOV VFs have it (sysfs-bus-pci)
        physfn = reader.readlink_name(f"{base}/physfn")
    return PciDevice(
        address=chain[-1],
        path=chain,
        vendor=reader.text(f"{base}/vendor"),
        device=reader.text(f"{base}/device"),
        pci_class=reader.text(f"{base}/class"),
        numa_node=numa,
        local_cpus=tuple(_safe_cpulist(reader.text(f"{base}/local_cpulist"))),
        physfn=physfn,
    )


def _safe_cpulist(text: str | None) -> list[int]:
    try:
        return _sysfs.parse_cpulist(text)
    except ValueError:
        return []
