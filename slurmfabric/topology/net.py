"""Network interfaces (/sys/class/net), their addresses and the IPv4 routing table.

sysfs has no IP addresses, so IPv4 addresses come from /proc/net/fib_trie (the ``/32 host
LOCAL`` leaves) matched to interfaces through the on-link routes of /proc/net/route, and
IPv6 ones from /proc/net/if_inet6 (proc(5)). Both are per network namespace, like NCCL's
own view when it picks a socket interface.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from slurmfabric.topology._io import Reader
from slurmfabric.topology.model import NetDev, Route

CLASS = "/sys/class/net"


def _hex_ip(value: str) -> str:
    # /proc/net/route prints IPv4 addresses as host-order (little-endian on x86) hex.
    return socket.inet_ntoa(struct.pack("<L", int(value, 16)))


def read_routes(reader: Reader) -> tuple[Route, ...]:
    text = reader.text("/proc/net/route") or ""
    routes: list[Route] = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        try:
            routes.append(
                Route(
                    iface=cols[0],
                    destination=_hex_ip(cols[1]),
                    gateway=_hex_ip(cols[2]),
                    metric=int(cols[6]),
                    mask=_hex_ip(cols[7]),
                )
            )
        except (ValueError, struct.error, OSError):
            continue
    return tuple(routes)


def _local_ipv4(reader: Reader) -> list[str]:
    text = reader.text("/proc/net/fib_trie") or ""
    found: list[str] = []
    last_leaf = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            last_leaf = stripped[3:].strip()
        elif stripped.startswith("/32 host LOCAL") and last_leaf and last_leaf not in found:
            found.append(last_leaf)
    return found


def _ipv4_by_iface(reader: Reader, routes: tuple[Route, ...]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for address in _local_ipv4(reader):
        ip = ipaddress.IPv4Address(address)
        best: tuple[int, Route] | None = None
        for route in routes:
            if route.gateway != "0.0.0.0":
                continue
            net = ipaddress.IPv4Network(f"{route.destination}/{route.mask}", strict=False)
            if net.prefixlen and ip in net and (best is None or net.prefixlen > best[0]):
                best = (net.prefixlen, route)
        if best is not None:
            result.setdefault(best[1].iface, []).append(f"{address}/{best[0]}")
    return result


def _ipv6_by_iface(reader: Reader) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for line in (reader.text("/proc/net/if_inet6") or "").splitlines():
        cols = line.split()
        if len(cols) != 6 or len(cols[0]) != 32:
            continue
        try:
            addr = ipaddress.IPv6Address(int(cols[0], 16))
            prefix = int(cols[2], 16)
        except ValueError:
            continue
        result.setdefault(cols[5], []).append(f"{addr.compressed}/{prefix}")
    return result


def discover_netdevs(reader: Reader, routes: tuple[Route, ...]) -> tuple[NetDev, ...]:
    v4 = _ipv4_by_iface(reader, routes)
    v6 = _ipv6_by_iface(reader)
    devices: list[NetDev] = []
    for name in reader.listdir(CLASS):
        base = f"{CLASS}/{name}"
        if not reader.is_dir(base):
            continue  # bonding_masters is a file in /sys/class/net
        pci_address = None
        if reader.exists(f"{base}/device"):
            pci_address = reader.readlink_name(f"{base}/device")
        speed = reader.int(f"{base}/speed")  # EINVAL while down; -1 when unknown
        slaves = (reader.text(f"{base}/bonding/slaves") or "").split()
        devices.append(
            NetDev(
                name=name,
                operstate=reader.text(f"{base}/operstate"),
                carrier=reader.int(f"{base}/carrier"),  # EINVAL while admin-down
                speed_mbps=speed if speed is not None and speed > 0 else None,
                type=reader.int(f"{base}/type"),
                address=reader.text(f"{base}/address"),
                mtu=reader.int(f"{base}/mtu"),
                pci_address=pci_address,
                master=reader.readlink_name(f"{base}/master")
                if reader.exists(f"{base}/master")
                else None,
                bond_slaves=tuple(slaves),
                ipv4=tuple(v4.get(name, ())),
                ipv6=tuple(v6.get(name, ())),
            )
        )
    return tuple(devices)


def route_to(
    address: str, netdevs: tuple[NetDev, ...], routes: tuple[Route, ...]
) -> tuple[str | None, str]:
    """The interface that reaches ``address`` and a one-line reason (longest prefix wins)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None, f"{address!r} is not an IP address"
    for dev in netdevs:
        for cidr in dev.ipv4 + dev.ipv6:
            if ipaddress.ip_interface(cidr).ip == ip:
                return dev.name, f"{address} is an address of {dev.name} (this node is the master)"
    if ip.version == 6:
        best6: tuple[int, str] | None = None
        for dev in netdevs:
            for cidr in dev.ipv6:
                net = ipaddress.ip_interface(cidr).network
                if (
                    ip in net
                    and not net.is_link_local
                    and (best6 is None or net.prefixlen > best6[0])
                ):
                    best6 = (net.prefixlen, dev.name)
        if best6:
            return best6[1], f"{address} is on-link via {best6[1]} (/{best6[0]})"
        return None, f"no IPv6 on-link prefix reaches {address}"
    best: tuple[int, int, Route] | None = None
    for route in routes:
        net = ipaddress.IPv4Network(f"{route.destination}/{route.mask}", strict=False)
        if ip in net:
            key = (net.prefixlen, -route.metric)
            if best is None or key > best[:2]:
                best = (net.prefixlen, -route.metric, route)
    if best is None:
        return None, f"no route in /proc/net/route reaches {address}"
    route = best[2]
    via = f"via gateway {route.gateway}" if route.gateway != "0.0.0.0" else "on-link"
    return (
        route.iface,
        f"route {route.destination}/{best[0]} {via} on {route.iface} reaches {address}",
    )
