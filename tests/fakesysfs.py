"""Build fake sysfs/procfs trees from a compact description, with real symlinks.

The layout follows the kernel ABI (Documentation/ABI/testing/sysfs-class-infiniband,
sysfs-bus-pci, sysfs-class-net, sysfs-devices-system-cpu and proc(5)):
``/sys/class/infiniband/<dev>`` links to ``../../devices/pci.../<bdf>/infiniband/<dev>``,
``/sys/bus/pci/devices/<bdf>`` to the function's directory, ``device`` links back to the
PCI function, VFs carry ``physfn``, bonds list ``bonding/slaves`` and slaves link ``master``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

IPV4_PREFIX = "0000:0000:0000:0000:0000:ffff:"


def v4gid(ip: str) -> str:
    """10.156.129.132 -> 0000:0000:0000:0000:0000:ffff:0a9c:8184 (IPv4-mapped GID)."""
    raw = socket.inet_aton(ip).hex()
    return f"{IPV4_PREFIX}{raw[:4]}:{raw[4:]}"


def v6gid(ip: str) -> str:
    full = ipaddress.IPv6Address(ip).exploded
    return full


def roce_gids(
    mac_ll: str, ipv4: str | None = None, ipv6: str | None = None, ndev: str = "", start: int = 0
) -> list[tuple[int, str, str, str]]:
    """A host RoCE GID table like show_gids prints (NVIDIA/nccl #1131): link-local v1/v2,
    then IPv4-mapped v1/v2 (and/or global IPv6 v1/v2). ``start`` shifts indices (pods)."""
    entries = [(mac_ll, "IB/RoCE v1"), (mac_ll, "RoCE v2")]
    if ipv4:
        entries += [(v4gid(ipv4), "IB/RoCE v1"), (v4gid(ipv4), "RoCE v2")]
    if ipv6:
        entries += [(v6gid(ipv6), "IB/RoCE v1"), (v6gid(ipv6), "RoCE v2")]
    return [(start + i, gid, kind, ndev) for i, (gid, kind) in enumerate(entries)]


@dataclass
class Port:
    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "InfiniBand"
    gids: list[tuple[int, str, str | None, str | None]] = field(default_factory=list)
    counters: dict[str, str] = field(default_factory=dict)
    gid_slots: int = 32  # zero GIDs fill the rest of the table (128-256 on real HCAs)


@dataclass
class Rdma:
    name: str
    pci: str  # "pci0000:17/0000:17:01.0/0000:18:00.0"
    numa: int = -1
    ports: dict[int, Port] = field(default_factory=lambda: {1: Port()})
    netdev: str | None = None  # created under the PCI function unless declared in nets
    uverbs: int | None = 0
    vendor: str = "0x15b3"
    device: str = "0x1021"
    pci_class: str = "0x020700"
    physfn: str | None = None  # PF address for a VF
    local_cpulist: str = ""


@dataclass
class Net:
    name: str
    pci: str | None = None  # None: a virtual device (bond, lo)
    operstate: str = "up"
    carrier: str | None = "1"
    speed: str | None = "100000"
    type: str = "1"
    address: str = "b8:3f:d2:00:00:01"
    mtu: str = "1500"
    master: str | None = None
    slaves: list[str] = field(default_factory=list)
    ipv4: list[str] = field(default_factory=list)  # "10.0.0.5/24"
    ipv6: list[str] = field(default_factory=list)
    dev_port: int = 0


@dataclass
class Gpu:
    pci: str
    numa: int = -1
    uuid: str | None = None
    minor: int | None = None
    model: str = "NVIDIA H100 80GB HBM3"
    local_cpulist: str = ""
    # "amd": vendor 0x1002 bound to amdgpu, with the DRM nodes amdgpu creates under the
    # function (device/drm/card<N>, device/drm/renderD<128+N>: Documentation/gpu/amdgpu)
    vendor: str = "nvidia"
    pci_device: str = "0x2330"
    pci_class: str = "0x030200"


@dataclass
class Node:
    numa: dict[int, str]  # node id -> cpulist; {} means no /sys/devices/system/node
    cpus: str  # online cpulist
    smt_offset: int | None = None  # cpu i and i+offset are siblings
    allowed: str | None = None  # Cpus_allowed_list of "the process"
    gpus: list[Gpu] = field(default_factory=list)
    rdma: list[Rdma] = field(default_factory=list)
    nets: list[Net] = field(default_factory=list)
    routes: list[tuple[str, str, str, str, int]] = field(
        default_factory=list
    )  # iface,dst,gw,mask,metric
    modules: list[str] = field(default_factory=list)
    driver: str | None = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05"
    kernel: str = "5.15.0-105-generic"
    files: dict[str, str] = field(default_factory=dict)


def _is_bdf(part: str) -> bool:
    return len(part) == 12 and part[4] == ":" and part[7] == ":" and part[10] == "."


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        return
    os.symlink(os.path.relpath(target, link.parent), link)


class _Tree:
    def __init__(self, root: Path, node: Node) -> None:
        self.root, self.node = root, node
        self.sys = root / "sys"

    def pci(
        self,
        path: str,
        *,
        vendor: str,
        device: str,
        pci_class: str,
        numa: int,
        local_cpulist: str,
        physfn: str | None = None,
    ) -> Path:
        parts = path.split("/")
        current = self.sys / "devices" / parts[0]
        current.mkdir(parents=True, exist_ok=True)
        for bridge in parts[1:-1]:
            current = current / bridge
            # Only PCI functions get PCI attributes: a virtual bus on the way (Hyper-V's
            # LNXSYSTM:00/.../VMBUS:00/<guid>/pci0001:00) is plain directories in sysfs.
            if _is_bdf(bridge) and not (current / "class").exists():
                self._function(current, "0x8086", "0x1234", "0x060400", numa, local_cpulist)
            else:
                current.mkdir(parents=True, exist_ok=True)
        current = current / parts[-1]
        self._function(current, vendor, device, pci_class, numa, local_cpulist)
        if physfn:
            _link(current / "physfn", current.parent / physfn)
        return current

    def _function(
        self,
        directory: Path,
        vendor: str,
        device: str,
        pci_class: str,
        numa: int,
        local_cpulist: str,
    ) -> None:
        _write(directory / "vendor", vendor)
        _write(directory / "device", device)
        _write(directory / "class", pci_class)
        _write(directory / "numa_node", str(numa))
        _write(directory / "local_cpulist", local_cpulist or self.node.cpus)
        _link(self.sys / "bus/pci/devices" / directory.name, directory)


def build(node: Node, root: str | os.PathLike[str]) -> Path:
    """Write ``node`` under ``root`` and return the root."""
    root = Path(root)
    tree = _Tree(root, node)
    sys_ = root / "sys"
    nets = {n.name: n for n in node.nets}

    for gpu in node.gpus:
        fn = tree.pci(
            gpu.pci,
            vendor="0x1002" if gpu.vendor == "amd" else "0x10de",
            device=gpu.pci_device,
            pci_class=gpu.pci_class,
            numa=gpu.numa,
            local_cpulist=gpu.local_cpulist,
        )
        if gpu.vendor == "amd":
            _link(sys_ / "bus/pci/drivers/amdgpu" / fn.name, fn)
            if gpu.minor is not None:
                (fn / "drm" / f"card{gpu.minor - 128}").mkdir(parents=True, exist_ok=True)
                (fn / "drm" / f"renderD{gpu.minor}").mkdir(parents=True, exist_ok=True)
            continue
        if node.driver:
            _link(sys_ / "bus/pci/drivers/nvidia" / fn.name, fn)
            info = [f"Model: \t\t {gpu.model}", "IRQ:   \t\t 100"]
            if gpu.uuid:
                info.append(f"GPU UUID: \t {gpu.uuid}")
            info += ["Bus Type: \t PCIe", f"Bus Location: \t {fn.name}"]
            if gpu.minor is not None:
                info.append(f"Device Minor: \t {gpu.minor}")
            _write(root / f"proc/driver/nvidia/gpus/{fn.name}/information", "\n".join(info))

    for dev in node.rdma:
        fn = tree.pci(
            dev.pci,
            vendor=dev.vendor,
            device=dev.device,
            pci_class=dev.pci_class,
            numa=dev.numa,
            local_cpulist=dev.local_cpulist,
            physfn=dev.physfn,
        )
        ib = fn / "infiniband" / dev.name
        _write(ib / "node_type", "1: CA")
        _write(ib / "fw_ver", "28.39.1002")
        _link(ib / "device", fn)
        _link(sys_ / "class/infiniband" / dev.name, ib)
        if dev.uverbs is not None:
            uv = fn / "infiniband_verbs" / f"uverbs{dev.uverbs}"
            _write(uv / "ibdev", dev.name)
            _link(sys_ / "class/infiniband_verbs" / uv.name, uv)
        for number, port in dev.ports.items():
            pdir = ib / "ports" / str(number)
            _write(pdir / "state", port.state)
            _write(pdir / "phys_state", port.phys_state)
            _write(pdir / "rate", port.rate)
            _write(pdir / "link_layer", port.link_layer)
            used = {g[0]: g for g in port.gids}
            for index in range(max([port.gid_slots, *[i + 1 for i in used]])):
                gid = used.get(index)
                _write(pdir / "gids" / str(index), gid[1] if gid else "0000:" * 7 + "0000")
                for kind, value in (
                    ("types", gid[2] if gid else None),
                    ("ndevs", gid[3] if gid else None),
                ):
                    target = pdir / "gid_attrs" / kind / str(index)
                    if value:
                        _write(target, value)
                    elif gid:
                        # The kernel answers EINVAL for a GID without a netdev (unused
                        # slots too); a directory makes open() fail the same way (EISDIR).
                        target.mkdir(parents=True, exist_ok=True)
            counters = {
                "symbol_error": "0",
                "link_downed": "0",
                "port_rcv_errors": "0",
                "port_xmit_data": "123456789",
                **port.counters,
            }
            for name, value in counters.items():
                _write(pdir / "counters" / name, value)
        if dev.netdev and dev.netdev not in nets:
            nets[dev.netdev] = Net(
                dev.netdev,
                pci=dev.pci,
                type="32" if dev.ports[1].link_layer == "InfiniBand" else "1",
            )
        elif dev.netdev and nets[dev.netdev].pci is None:
            nets[dev.netdev].pci = dev.pci

    for net in nets.values():
        if net.pci:
            fn = sys_ / "devices" / net.pci
            ndir = fn / "net" / net.name
            _link(ndir / "device", fn)
        else:
            ndir = sys_ / "devices/virtual/net" / net.name
        ndir.mkdir(parents=True, exist_ok=True)
        attrs = {
            "operstate": net.operstate,
            "carrier": net.carrier,
            "speed": net.speed,
            "type": net.type,
            "address": net.address,
            "mtu": net.mtu,
            "dev_port": str(net.dev_port),
        }
        for key, value in attrs.items():
            if value is not None:
                _write(ndir / key, value)
            else:
                (ndir / key).mkdir(exist_ok=True)  # EINVAL while the link is down
        if net.slaves:
            _write(ndir / "bonding" / "slaves", " ".join(net.slaves))
        _link(sys_ / "class/net" / net.name, ndir)
    for net in nets.values():
        if net.master:
            _link(
                (sys_ / "class/net" / net.name).resolve() / "master",
                (sys_ / "class/net" / net.master).resolve(),
            )

    # NUMA nodes, CPUs, hyperthread siblings
    for node_id, cpulist in node.numa.items():
        _write(sys_ / f"devices/system/node/node{node_id}/cpulist", cpulist)
    if node.numa:
        _write(sys_ / "devices/system/node/online", ",".join(str(i) for i in sorted(node.numa)))
    _write(sys_ / "devices/system/cpu/online", node.cpus)
    from slurmfabric._common.sysfs import format_cpulist, parse_cpulist

    cpus = parse_cpulist(node.cpus)
    for cpu in cpus:
        siblings = [cpu]
        if node.smt_offset:
            pair = cpu + node.smt_offset if cpu + node.smt_offset in cpus else cpu - node.smt_offset
            siblings = sorted({cpu, pair})
        _write(
            sys_ / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list",
            format_cpulist(siblings),
        )
    _write(
        root / "proc/self/status",
        f"Name:\tpython3\nCpus_allowed_list:\t{node.allowed or node.cpus}",
    )

    # addresses and routes (proc(5): /proc/net/route, fib_trie, if_inet6)
    route_lines = [
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"
    ]
    trie_local: list[str] = []

    def hexip(ip: str) -> str:
        return f"{struct.unpack('<L', socket.inet_aton(ip))[0]:08X}"

    for iface, dst, gw, mask, metric in node.routes:
        route_lines.append(
            f"{iface}\t{hexip(dst)}\t{hexip(gw)}\t0003\t0\t0\t{metric}\t{hexip(mask)}\t0\t0\t0"
        )
    inet6: list[str] = []
    for index, net in enumerate(nets.values(), start=2):
        for cidr in net.ipv4:
            iface = ipaddress.IPv4Interface(cidr)
            route_lines.append(
                f"{net.name}\t{hexip(str(iface.network.network_address))}\t00000000\t0001\t0\t0\t0\t"
                f"{hexip(str(iface.netmask))}\t0\t0\t0"
            )
            trie_local.append(f"     |-- {iface.ip}\n        /32 host LOCAL")
        for cidr in net.ipv6:
            iface6 = ipaddress.IPv6Interface(cidr)
            inet6.append(
                f"{iface6.ip.exploded.replace(':', '')} {index:02x} "
                f"{iface6.network.prefixlen:02x} 00 80 {net.name}"
            )
    _write(root / "proc/net/route", "\n".join(route_lines))
    _write(
        root / "proc/net/fib_trie",
        "Main:\n  +-- 0.0.0.0/0 3 0 5\nLocal:\n  +-- 0.0.0.0/0 3 0 5\n" + "\n".join(trie_local),
    )
    _write(root / "proc/net/if_inet6", "\n".join(inet6))

    for module in node.modules:
        _write(sys_ / "module" / module / "version", "535.104.05")
    if node.driver:
        _write(root / "proc/driver/nvidia/version", node.driver)
    _write(root / "proc/sys/kernel/osrelease", node.kernel)
    for path, text in node.files.items():
        _write(root / path.lstrip("/"), text)
    return root
