"""Network interfaces (/sys/class/net), their addresses and the IPv4 routing table.

sysfs has no IP addresses, so IPv4 addresses come from /proc/net/fib_trie (the ``/32 host
LOCAL`` leaves) matched to interfaces through the on-link routes of /proc/net/route, and
IPv6 ones from /proc/net/if_inet6 (proc(5)). Both are per network namespace, like NCCL's
own view when it picks a socket interface.

IPv4 arithmetic is done on plain ints here rather than with ``ipaddress``/``socket``
(together ~7 ms to import on every rank); IPv6 master addresses, which are rare, still go
through ``ipaddress``.
"""

from __future__ import annotations

from slurmfabric.topology._io import Reader
from slurmfabric.topology.model import NetDev, Route

CLASS = "/sys/class/net"


def _hex_ip(value: str) -> str:
    # /proc/net/route prints IPv4 addresses as host-order (little-endian on x86) hex.
    number = int(value, 16)
    if not 0 <= number <= 0xFFFFFFFF:
        raise ValueError(f"not a 32-bit address: {value!r}")
    return ".".join(str((number >> shift) & 0xFF) for shift in (0, 8, 16, 24))


def parse_ipv4(text: str) -> int | None:
    """Dotted-quad IPv4 as an int, or None; as strict as ``ipaddress`` (no leading zeros)."""
    parts = text.split(".")
    if len(parts) != 4:
        return None
    number = 0
    for part in parts:
        if not part or len(part) > 3 or not part.isascii() or not part.isdigit():
            return None
        if len(part) > 1 and part[0] == "0":
            return None
        octet = int(part)
        if octet > 255:
            return None
        number = number << 8 | octet
    return number


def _prefixlen(mask: int) -> int | None:
    """Length of a contiguous netmask (255.255.255.0 -> 24), None if not contiguous."""
    length = bin(mask).count("1")
    return length if mask == (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF else None


def _compress_v6(hex32: str) -> str:
    """32 hex digits -> RFC 5952 text, as ``ipaddress.IPv6Address(...).compressed`` (3.11)."""
    hextets = [f"{int(hex32[i : i + 4], 16):x}" for i in range(0, 32, 4)]
    best_start, best_len, start, length = -1, 0, -1, 0
    for index, hextet in enumerate(hextets):
        if hextet == "0":
            if length == 0:
                start = index
            length += 1
            if length > best_len:
                best_start, best_len = start, length
        else:
            length = 0
    if best_len > 1:
        end = best_start + best_len
        tail = hextets[end:] or [""]
        head = hextets[:best_start] or [""]
        hextets = [*head, "", *tail] if head != [""] or tail != [""] else ["", "", ""]
    return ":".join(hextets)


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
        except ValueError:
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


def _route_net(route: Route) -> tuple[int, int, int] | None:
    """(network, mask, prefix length) of a route as ints, None if unparsable."""
    dest, mask = parse_ipv4(route.destination), parse_ipv4(route.mask)
    if dest is None or mask is None:
        return None
    length = _prefixlen(mask)
    return None if length is None else (dest & mask, mask, length)


def _ipv4_by_iface(reader: Reader, routes: tuple[Route, ...]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    on_link = [(r, _route_net(r)) for r in routes if r.gateway == "0.0.0.0"]
    for address in _local_ipv4(reader):
        ip = parse_ipv4(address)
        if ip is None:
            continue
        best: tuple[int, Route] | None = None
        for route, net in on_link:
            if net is None:
                continue
            network, mask, length = net
            if length and ip & mask == network and (best is None or length > best[0]):
                best = (length, route)
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
            addr = _compress_v6(cols[0])
            prefix = int(cols[2], 16)
        except ValueError:
            continue
        result.setdefault(cols[5], []).append(f"{addr}/{prefix}")
    return result


def read_vlans(reader: Reader) -> dict[str, tuple[int, str]]:
    """VLAN device -> (VLAN id, real device), from /proc/net/vlan/config.

    One file for every VLAN of the network namespace, written by net/8021q/vlanproc.c
    (``vlan_seq_show``): two header lines (``VLAN Dev name | VLAN ID``, ``Name-Type: ...``),
    then ``"%-15s| %d  | %s"`` per device (name, VLAN id, real device). Absent when the
    8021q module is not loaded, which means no VLAN device exists."""
    found: dict[str, tuple[int, str]] = {}
    for line in (reader.text("/proc/net/vlan/config") or "").splitlines():
        cols = [c.strip() for c in line.split("|")]
        # ASCII digits only ("²".isdigit() is True, int() refuses it); 802.1Q ids 1-4094
        if len(cols) == 3 and cols[1].isascii() and cols[1].isdigit() and cols[0] \
                and cols[2] and 0 < int(cols[1][:5]) < 4095 and len(cols[1]) < 5:
            found[cols[0]] = (int(cols[1]), cols[2])
    return found


def discover_netdevs(
    reader: Reader, routes: tuple[Route, ...], *, plan_only: bool = False
) -> tuple[NetDev, ...]:
    """Every interface. ``plan_only`` reads only what the plan uses (addresses, bonds and
    their slaves): operstate, carrier, speed, type, MAC and MTU stay None."""
    v4 = _ipv4_by_iface(reader, routes)
    v6 = _ipv6_by_iface(reader)
    vlans = read_vlans(reader)
    devices: list[NetDev] = []
    for name in reader.listdir(CLASS):
        base = f"{CLASS}/{name}"
        if not reader.is_dir(base):
            continue  # bonding_masters is a file in /sys/class/net
        pci_address = None
        if reader.exists(f"{base}/device"):
            pci_address = reader.readlink_name(f"{base}/device")
        slaves = (reader.text(f"{base}/bonding/slaves") or "").split()
        if plan_only:
            devices.append(
                NetDev(
                    name, None, None, None, None, None, None, pci_address,
                    reader.readlink_name(f"{base}/master")
                    if reader.exists(f"{base}/master")
                    else None,
                    tuple(slaves), tuple(v4.get(name, ())), tuple(v6.get(name, ())),
                    *vlans.get(name, (None, None)),
                )
            )  # fmt: skip
            continue
        speed = reader.int(f"{base}/speed")  # EINVAL while down; -1 when unknown
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
                vlan_id=vlans.get(name, (None, None))[0],
                vlan_of=vlans.get(name, (None, None))[1],
            )
        )
    return tuple(devices)


def route_to(
    address: str, netdevs: tuple[NetDev, ...], routes: tuple[Route, ...]
) -> tuple[str | None, str]:
    """The interface that reaches ``address`` and a one-line reason (longest prefix wins)."""
    if parse_ipv4(address) is not None:
        return _route_to_v4(address, netdevs, routes)
    import ipaddress  # IPv6 (or odd) master addresses only

    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None, f"{address!r} is not an IP address"
    # parse_ipv4 is as strict as ipaddress, so an IPv4 address never gets here.
    for dev in netdevs:
        for cidr in dev.ipv6:
            if ipaddress.ip_interface(cidr).ip == ip:
                return dev.name, f"{address} is an address of {dev.name} (this node is the master)"
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


def _route_to_v4(
    address: str, netdevs: tuple[NetDev, ...], routes: tuple[Route, ...]
) -> tuple[str | None, str]:
    """``route_to`` for a dotted-quad address, in int arithmetic (the per-rank case)."""
    ip = parse_ipv4(address)
    for dev in netdevs:
        for cidr in dev.ipv4:
            if parse_ipv4(cidr.partition("/")[0]) == ip:
                return dev.name, f"{address} is an address of {dev.name} (this node is the master)"
    best: tuple[int, int, Route] | None = None
    for route in routes:
        net = _route_net(route)
        if net is None:
            continue
        network, mask, length = net
        if ip is not None and ip & mask == network:
            key = (length, -route.metric)
            if best is None or key > best[:2]:
                best = (length, -route.metric, route)
    if best is None:
        return None, f"no route in /proc/net/route reaches {address}"
    route = best[2]
    via = f"via gateway {route.gateway}" if route.gateway != "0.0.0.0" else "on-link"
    return (
        route.iface,
        f"route {route.destination}/{best[0]} {via} on {route.iface} reaches {address}",
    )
