"""Which RDMA ports carry NCCL traffic (the rails), and which GID each RoCE rail uses.

Rules (Documentation/ABI/stable/sysfs-class-infiniband and the NCCL env docs): a rail is an
ACTIVE/LinkUp port within PXB of a GPU, in the node's dominant link layer, at the highest
rate; frontend (bonded, unless next to a GPU: a RoCE LAG rail) and storage NICs, Down or
INIT ports, SR-IOV VFs whose PF is visible and devices without a uverbs node are left out,
each with a reason. A port that would be a rail but is down is kept in ``down``, and every
rail position (up, down or slow) in ``slots``: what the health port checks judge. On an
AWS EFA node the EFA ports are the rails (NCCL drives them through aws-ofi-nccl, so they
set no NCCL_IB_*), and InfiniBand ports beside them (p6-b200's NVLink management) are not.
"""

from __future__ import annotations

from slurmfabric._common.record import Record
from slurmfabric.topology.model import Gid, RdmaDevice, RdmaPort, Topology, distance_rank

TYPE_CHECKING = False  # no typing at run time
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import TypeVar

    T = TypeVar("T")


class RailChoice(Record):
    __slots__ = (
        "rails", "excluded", "link_layer", "rate_gbps", "family", "gids", "nearest", "warnings",
        "notes", "down", "slots", "gid_policy",
    )  # fmt: skip
    _defaults = {"link_layer": None, "rate_gbps": None, "family": "AF_INET", "gid_policy": None}
    _factories = {"rails": list, "excluded": dict, "gids": dict, "nearest": dict, "warnings": list,
                  "notes": list, "down": list, "slots": list}
    _frozen = False
    rails: list[RdmaPort]
    excluded: dict[str, str]  # "mlx5_4:1" -> why
    link_layer: str | None
    rate_gbps: float | None
    family: str  # RoCE address family of the chosen GIDs
    gids: dict[str, Gid]  # rail name -> chosen GID
    nearest: dict[str, str]  # port -> distance to nearest GPU
    warnings: list[str]
    notes: list[str]  # decisions worth saying (a bonded port taken as a rail)
    down: list[RdmaPort]  # rail positions whose port is not up (left out, named in a warning)
    slots: list[RdmaPort]  # every rail position: the rails, down rails, slower rails by a GPU
    gid_policy: str | None  # the site's GID choice that applied ("VLAN 100", a range)


def _bonds(topo: Topology) -> set[str]:
    return {n.name for n in topo.netdevs if n.is_bond}


def _bond_of(topo: Topology, port: RdmaPort, bonds: set[str]) -> str | None:
    names = {port.netdev} | {g.ndev for g in port.gids}
    for name in names:
        if not name:
            continue
        if name in bonds:
            return name
        dev = topo.netdev(name)
        if dev is not None and dev.master in bonds:
            return dev.master
    return None


class GidPolicy:
    """The site's choice among a rail's routable GIDs: NCCL_IB_ADDR_RANGE (NCCL >= 2.21
    honours the same range itself, NCCL env docs) and/or the VLAN whose netdev carries the
    RoCE subnet (``SLURMFABRIC_ROCE_VLAN``; 0 = the untagged netdev). Each GID names its
    netdev in gid_attrs/ndevs/<index> (Documentation/ABI/stable/sysfs-class-infiniband), a
    VLAN netdev when the address sits on one; /proc/net/vlan/config says which is a VLAN."""

    __slots__ = ("range_text", "v4", "v6", "vlan")

    def __init__(self, addr_range: str | None = None, vlan: int | None = None) -> None:
        from slurmfabric.topology.net import parse_ipv4

        self.range_text = (addr_range or "").strip() or None
        self.v4: tuple[int, int] | None = None  # (network, mask)
        self.v6: object = None  # ipaddress.IPv6Network, only imported for an IPv6 range
        self.vlan = vlan
        if self.range_text:
            base, _, bits = self.range_text.partition("/")
            ip = parse_ipv4(base)
            if ip is not None:
                length = int(bits) if bits.isdigit() and int(bits) <= 32 else -1
                if length < 0:
                    raise ValueError(f"{self.range_text!r} is not an IPv4 CIDR range")
                mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
                self.v4 = (ip & mask, mask)
            else:
                import ipaddress  # an IPv6 range only: ~1.5 ms

                self.v6 = ipaddress.IPv6Network(self.range_text, strict=False)

    @property
    def active(self) -> bool:
        return self.range_text is not None or self.vlan is not None

    @property
    def family(self) -> str | None:
        if self.v4 is not None:
            return "AF_INET"
        return "AF_INET6" if self.v6 is not None else None

    def describe(self) -> str:
        parts = []
        if self.range_text:
            parts.append(f"NCCL_IB_ADDR_RANGE={self.range_text}")
        if self.vlan is not None:
            parts.append("untagged netdev (SLURMFABRIC_ROCE_VLAN=0)" if self.vlan == 0
                         else f"VLAN {self.vlan} (SLURMFABRIC_ROCE_VLAN)")
        return " and ".join(parts)

    def allows(self, gid: Gid, topo: Topology) -> bool:
        if self.range_text:
            if gid.is_ipv4_mapped:
                from slurmfabric.topology.net import parse_ipv4

                ip = parse_ipv4(gid.ipv4 or "")
                if self.v4 is None or ip is None or ip & self.v4[1] != self.v4[0]:
                    return False
            else:
                import ipaddress

                if self.v6 is None or ipaddress.IPv6Address(gid.gid) not in self.v6:  # type: ignore[operator]
                    return False
        if self.vlan is not None:
            dev = topo.netdev(gid.ndev) if gid.ndev else None
            tag = dev.vlan_id if dev is not None else None
            if (tag or 0) != self.vlan:
                return False
        return True


def usable_gids(port: RdmaPort, family: str, topo: Topology,
                policy: GidPolicy | None = None) -> list[Gid]:
    """Every GID NCCL could address the port by: RoCE v2, not link-local, in ``family``,
    and allowed by the site's policy; in table order (NCCL >= 2.21 takes the first)."""
    return [g for g in port.gids
            if g.is_v2 and not g.is_link_local and (family == "AF_INET6") != g.is_ipv4_mapped
            and (policy is None or policy.allows(g, topo))]


def _state_reason(port: RdmaPort) -> str | None:
    if port.state != "ACTIVE":
        hint = " (link up but no subnet manager has configured it)" if port.state == "INIT" else ""
        return f"port state {port.state}{hint}"
    if port.phys_state != "LinkUp":
        return f"physical state {port.phys_state}"
    return None


def _no_gid_reason(family: str | None, policy: GidPolicy) -> str:
    kind = {"AF_INET6": "IPv6 ", "AF_INET": "IPv4 "}.get(family or "", "")
    if policy.active:
        return f"no RoCE v2 {kind}GID on {policy.describe()}"
    return f"no RoCE v2 {kind}GID (no address on its netdev?)"


def choose_rails(topo: Topology, family: str | None = None, *, addr_range: str | None = None,
                 vlan: int | None = None) -> RailChoice:
    """The rails of ``topo``. ``family`` (NCCL_IB_ADDR_FAMILY), ``addr_range``
    (NCCL_IB_ADDR_RANGE) and ``vlan`` narrow which RoCE GIDs count; the address family is
    then decided by the rails alone, never by a frontend or storage port."""
    choice = RailChoice()
    policy = GidPolicy(addr_range, vlan)
    if family is None:
        family = policy.family
    bonds = _bonds(topo)
    pf_addresses = {d.pci.address: d.name for d in topo.rdma if d.pci and not d.is_vf}
    candidates: list[tuple[RdmaDevice, RdmaPort]] = []
    downed: list[tuple[RdmaDevice, RdmaPort]] = []  # not up, but otherwise a possible rail
    bonded: dict[str, str] = {}  # port -> its bond: a rail only if it sits next to a GPU
    if any(dev.is_efa for dev in topo.rdma):
        _efa_rails(choice, topo)
        return choice
    for dev in topo.rdma:
        for port in dev.ports:
            other = None
            if dev.is_vf and dev.pci and dev.pci.physfn in pf_addresses:
                other = f"SR-IOV VF of {pf_addresses[dev.pci.physfn]} (its PF is visible here)"
            if other is None and (bond := _bond_of(topo, port, bonds)):
                bonded[port.name] = bond
            if other is None and not dev.has_uverbs:
                other = ("no uverbs device: verbs cannot open it (not in this container's "
                         "/dev/infiniband: in a pod, the RDMA device plugin did not allocate it)")
            state = _state_reason(port)
            if state or other:
                choice.excluded[port.name] = state or other  # type: ignore[assignment]
                if state and other is None:
                    downed.append((dev, port))
            else:
                candidates.append((dev, port))

    # RoCE needs a routable GID: a port with none in either family is no rail. The family
    # (also an explicit NCCL_IB_ADDR_FAMILY) is applied to the rails only, in _choose_gids:
    # a frontend NIC's IPv4 address must neither rule out IPv6-only rails nor make the
    # frontend the rail of GPUs it is far from.
    kept: list[tuple[RdmaDevice, RdmaPort]] = []
    for dev, port in candidates:
        if port.link_layer == "Ethernet" and not any(
                usable_gids(port, f, topo, policy) for f in ("AF_INET", "AF_INET6")):
            choice.excluded[port.name] = _no_gid_reason(family, policy)
            continue
        kept.append((dev, port))

    # Distance to the nearest GPU decides rail vs frontend/storage. A bonded port is a
    # frontend NIC (the host's bond0) unless it sits within PXB of a GPU: then it is a
    # hardware LAG device (mlx5_bond_N, one RDMA device over both ports) used as a rail.
    if topo.gpus:
        for dev, port in kept + downed:
            best = min((topo.distance(g, dev) for g in topo.gpus), key=distance_rank)
            choice.nearest[port.name] = best
    lag = [p.name for _, p in kept if p.name in bonded
           and distance_rank(choice.nearest.get(p.name, "SYS")) <= 1]
    for dev, port in list(kept):
        if port.name in bonded and port.name not in lag:
            near_gpu = choice.nearest.get(port.name)
            where = f" (nearest GPU {near_gpu})" if near_gpu else ""
            choice.excluded[port.name] = f"on {bonded[port.name]}: a bonded frontend NIC{where}"
            kept.remove((dev, port))
    if lag:
        choice.notes.append(
            f"{', '.join(lag)}: bonded (hardware LAG) and within PXB of a GPU, so rails")
    near_filter = False
    if topo.gpus:
        near = [(d, p) for d, p in kept if distance_rank(choice.nearest[p.name]) <= 1]
        near_filter = bool(near)
        if near:
            for _, port in kept:
                if distance_rank(choice.nearest[port.name]) > 1:
                    choice.excluded[port.name] = (
                        f"nearest GPU is {choice.nearest[port.name]}: "
                        "a storage/frontend NIC, not a rail"
                    )
            kept = near
        elif kept and topo.coherent_gpus:
            choice.notes.append(
                f"{topo.coherent_gpus}: no NIC shares a PCIe switch with a GPU "
                "by design, so every active port is a rail"
            )
        elif kept:
            choice.warnings.append(
                "no RDMA port is within PXB of a GPU (flat or virtualised PCIe?): "
                "using every active port as a rail"
            )

    layer = None
    if kept:
        layers = _count(p.link_layer for _, p in kept)
        # Most ports wins; on a tie InfiniBand beats Ethernet (native fabric, no GID to
        # get wrong).
        layer = max(layers, key=lambda name: (layers[name], name == "InfiniBand"))
        rate = max((p.rate_gbps or 0.0) for _, p in kept if p.link_layer == layer)
        for _, port in kept:
            if port.link_layer != layer:
                choice.excluded[port.name] = f"link layer {port.link_layer}; the rails are {layer}"
            elif (port.rate_gbps or 0.0) < rate:
                choice.excluded[port.name] = (
                    f"{_gbps(port.rate_gbps)} Gb/s; the rails run at {_gbps(rate)} Gb/s"
                )
                if near_filter:  # a rail running slow, not a storage NIC at its own speed
                    choice.slots.append(port)
            else:
                choice.rails.append(port)
                choice.slots.append(port)
        choice.link_layer, choice.rate_gbps = layer, rate
    _down_slots(choice, topo, downed, bonded, layer, near_filter)
    order = {p.name: i for i, p in enumerate(topo.ports)}
    choice.slots.sort(key=lambda p: order.get(p.name, 0))
    if layer == "Ethernet":
        _choose_gids(choice, topo, family, policy)
    return choice


# On an EFA node NCCL's traffic goes over the EFA devices (the aws-ofi-nccl plugin); an
# mlx5 InfiniBand device beside them is no data NIC. p6-b200.48xlarge shows two, ibp115s0f0
# and ibp116s0f0, the NVLink switch management ports (HGX B200's fourth-generation
# NVSwitches are managed over InfiniBand by NVLSM): aws/sagemaker-hyperpod-cli#282,
# aws-samples/aws-do-eks#63, NVIDIA Fabric Manager user guide "Systems Using Fourth
# Generation NVSwitches".
_NOT_DATA_ON_EFA = ("{layer} device on an EFA node: no data NIC (NCCL uses the EFA devices "
                    "through aws-ofi-nccl; on p6-b200 such ports manage the NVLink switches)")


def _efa_rails(choice: RailChoice, topo: Topology) -> None:
    """The EFA ports are the rails: every one is a slot the port checks judge, the active
    ones carry NCCL's traffic, a down one is named; every other RDMA port is no rail."""
    for dev in topo.rdma:
        for port in dev.ports:
            if not dev.is_efa:
                choice.excluded[port.name] = _NOT_DATA_ON_EFA.format(layer=port.link_layer)
                continue
            choice.slots.append(port)
            state = _state_reason(port)
            if state:
                choice.excluded[port.name] = state
                choice.down.append(port)
            else:
                choice.rails.append(port)
    if topo.gpus:
        for port in choice.slots:
            dev = next(d for d in topo.rdma if port in d.ports)
            choice.nearest[port.name] = min((topo.distance(g, dev) for g in topo.gpus),
                                            key=distance_rank)
    if choice.rails:
        choice.link_layer = choice.rails[0].link_layer
        choice.rate_gbps = max((p.rate_gbps or 0.0) for p in choice.rails)


def _down_slots(choice: RailChoice, topo: Topology, downed: list[tuple[RdmaDevice, RdmaPort]],
                bonded: dict[str, str], layer: str | None, near_filter: bool) -> None:
    """Ports left out for their state that would be rails if up: within PXB of a GPU (where
    any port is), not a bonded frontend, in the rails' link layer. Their rate and GIDs say
    nothing while the link is down."""
    by_gpu = [p for _, p in downed if distance_rank(choice.nearest.get(p.name, "SYS")) <= 1]
    for _, port in downed:
        near = port in by_gpu
        if (near_filter or by_gpu) and not near:
            continue
        if port.name in bonded and not near:
            continue
        if layer is not None and port.link_layer != layer:
            continue
        choice.down.append(port)
        choice.slots.append(port)


def _choose_gids(choice: RailChoice, topo: Topology, family: str | None,
                 policy: GidPolicy) -> None:
    """One family for the node, from the rails only; then each rail's GID in it."""
    if family is None:
        has_v4 = any(usable_gids(p, "AF_INET", topo, policy) for p in choice.rails)
        has_v6 = any(usable_gids(p, "AF_INET6", topo, policy) for p in choice.rails)
        family = "AF_INET6" if (has_v6 and not has_v4) else "AF_INET"
    choice.family = family
    if policy.active:
        choice.gid_policy = policy.describe()
    ambiguous: list[str] = []
    for port in list(choice.rails):
        gids = usable_gids(port, family, topo, policy)
        if not gids:
            choice.excluded[port.name] = _no_gid_reason(family, policy)
            choice.rails.remove(port)
            continue
        choice.gids[port.name] = gids[0]
        first_per_ndev: dict[str | None, Gid] = {}
        for gid in gids:
            first_per_ndev.setdefault(gid.ndev, gid)
        if len(first_per_ndev) > 1:
            ambiguous.append(f"{port.name}: " + ", ".join(
                f"index {g.index} on {_ndev_words(topo, g.ndev)}"
                for g in first_per_ndev.values()))
    if ambiguous:
        by = f" allowed by {policy.describe()}" if policy.active else ""
        choice.warnings.append(
            f"RoCE rail GIDs{by} sit on more than one netdev (" + "; ".join(ambiguous)
            + "): took the first of each table, as NCCL >= 2.21 would; if the rail subnet "
            "is on another netdev, set NCCL_IB_ADDR_RANGE to that subnet (e.g. in "
            "fabric.nccl) or SLURMFABRIC_ROCE_VLAN to its VLAN id (0: untagged)")


def _ndev_words(topo: Topology, name: str | None) -> str:
    """``ens1f0np0.100 (VLAN 100 on ens1f0np0)``, or the bare name of any other netdev."""
    if not name:
        return "no netdev"
    dev = topo.netdev(name)
    if dev is not None and dev.is_vlan:
        return f"{name} (VLAN {dev.vlan_id} on {dev.vlan_of})"
    return name


def _count(items: Iterable[T]) -> dict[T, int]:
    """collections.Counter's counting (first-seen order kept) without importing it."""
    counts: dict[T, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def _gbps(rate: float | None) -> str:
    if rate is None:
        return "?"
    return str(int(rate)) if float(rate).is_integer() else str(rate)


def gid_index(choice: RailChoice) -> tuple[int | None, list[str]]:
    """The one NCCL_IB_GID_INDEX for the node (NCCL < 2.21 uses one index for every HCA)."""
    if not choice.gids:
        return None, []
    counts = _count(g.index for g in choice.gids.values())
    index = max(counts, key=lambda i: (counts[i], -i))
    odd = [name for name, g in choice.gids.items() if g.index != index]
    return index, odd
