"""Which RDMA ports carry NCCL traffic (the rails), and which GID each RoCE rail uses.

Rules (Documentation/ABI/stable/sysfs-class-infiniband and the NCCL env docs): a rail is an
ACTIVE/LinkUp port within PXB of a GPU, in the node's dominant link layer, at the highest
rate; frontend (bonded, unless next to a GPU: a RoCE LAG rail) and storage NICs, Down or
INIT ports, SR-IOV VFs whose PF is visible and devices without a uverbs node are left out,
each with a reason.
"""

from __future__ import annotations

from slurmfabric._record import Record
from slurmfabric._sysfs import format_cpulist
from slurmfabric.topology.model import Gid, RdmaDevice, RdmaPort, Topology, distance_rank

TYPE_CHECKING = False  # no typing at run time
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import TypeVar

    T = TypeVar("T")


class RailChoice(Record):
    __slots__ = (
        "rails", "excluded", "link_layer", "rate_gbps", "family", "gids", "nearest", "warnings",
        "notes",
    )  # fmt: skip
    _defaults = {"link_layer": None, "rate_gbps": None, "family": "AF_INET"}
    _factories = {"rails": list, "excluded": dict, "gids": dict, "nearest": dict, "warnings": list,
                  "notes": list}
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


def routable_gid(port: RdmaPort, family: str) -> Gid | None:
    """NCCL >= 2.21's own pick: RoCE v2, not link-local, IPv4-mapped unless AF_INET6."""
    for gid in port.gids:
        if not gid.is_v2 or gid.is_link_local:
            continue
        if (family == "AF_INET6") != gid.is_ipv4_mapped:
            return gid
    return None


def _state_reason(port: RdmaPort) -> str | None:
    if port.state != "ACTIVE":
        hint = " (link up but no subnet manager has configured it)" if port.state == "INIT" else ""
        return f"port state {port.state}{hint}"
    if port.phys_state != "LinkUp":
        return f"physical state {port.phys_state}"
    return None


def choose_rails(topo: Topology, family: str | None = None) -> RailChoice:
    choice = RailChoice()
    bonds = _bonds(topo)
    pf_addresses = {d.pci.address: d.name for d in topo.rdma if d.pci and not d.is_vf}
    candidates: list[tuple[RdmaDevice, RdmaPort]] = []
    bonded: dict[str, str] = {}  # port -> its bond: a rail only if it sits next to a GPU
    for dev in topo.rdma:
        if dev.is_efa:
            for port in dev.ports:
                choice.excluded[port.name] = "AWS EFA device: the aws-ofi-nccl plugin drives it"
            continue
        for port in dev.ports:
            why = _state_reason(port)
            if why is None and dev.is_vf and dev.pci and dev.pci.physfn in pf_addresses:
                why = f"SR-IOV VF of {pf_addresses[dev.pci.physfn]} (its PF is visible here)"
            if why is None and (bond := _bond_of(topo, port, bonds)):
                bonded[port.name] = bond
            if why is None and not dev.has_uverbs:
                why = ("no uverbs device: verbs cannot open it (not in this container's "
                       "/dev/infiniband: in a pod, the RDMA device plugin did not allocate it)")
            if why:
                choice.excluded[port.name] = why
            else:
                candidates.append((dev, port))

    # RoCE needs a routable GID; pick the family once for the whole node.
    roce = [p for _, p in candidates if p.link_layer == "Ethernet"]
    if family is None:
        has_v4 = any(routable_gid(p, "AF_INET") for p in roce)
        has_v6 = any(routable_gid(p, "AF_INET6") for p in roce)
        family = "AF_INET6" if (has_v6 and not has_v4) else "AF_INET"
    choice.family = family
    kept: list[tuple[RdmaDevice, RdmaPort]] = []
    for dev, port in candidates:
        if port.link_layer == "Ethernet":
            gid = routable_gid(port, family)
            if gid is None:
                kind = "IPv6" if family == "AF_INET6" else "IPv4"
                choice.excluded[port.name] = f"no RoCE v2 {kind} GID (no address on its netdev?)"
                continue
            choice.gids[port.name] = gid
        kept.append((dev, port))

    # Distance to the nearest GPU decides rail vs frontend/storage. A bonded port is a
    # frontend NIC (the host's bond0) unless it sits within PXB of a GPU: then it is a
    # hardware LAG device (mlx5_bond_N, one RDMA device over both ports) used as a rail.
    if topo.gpus:
        for dev, port in kept:
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
    if topo.gpus:
        near = [(d, p) for d, p in kept if distance_rank(choice.nearest[p.name]) <= 1]
        if near:
            for _, port in kept:
                if distance_rank(choice.nearest[port.name]) > 1:
                    choice.excluded[port.name] = (
                        f"nearest GPU is {choice.nearest[port.name]}: "
                        "a storage/frontend NIC, not a rail"
                    )
            kept = near
        elif kept and topo.cpuless_numa:
            choice.notes.append(
                f"GPU memory is CPU-less NUMA nodes "
                f"{format_cpulist(list(topo.cpuless_numa))} (coherent "
                "GPUs, e.g. Grace over NVLink-C2C): no NIC shares a PCIe switch with a GPU "
                "by design, so every active port is a rail"
            )
        elif kept:
            choice.warnings.append(
                "no RDMA port is within PXB of a GPU (flat or virtualised PCIe?): "
                "using every active port as a rail"
            )

    if not kept:
        return choice
    layers = _count(p.link_layer for _, p in kept)
    # Most ports wins; on a tie InfiniBand beats Ethernet (native fabric, no GID to get wrong).
    layer = max(layers, key=lambda name: (layers[name], name == "InfiniBand"))
    rate = max((p.rate_gbps or 0.0) for _, p in kept if p.link_layer == layer)
    for _, port in kept:
        if port.link_layer != layer:
            choice.excluded[port.name] = f"link layer {port.link_layer}; the rails are {layer}"
        elif (port.rate_gbps or 0.0) < rate:
            choice.excluded[port.name] = (
                f"{_gbps(port.rate_gbps)} Gb/s; the rails run at {_gbps(rate)} Gb/s"
            )
        else:
            choice.rails.append(port)
    choice.link_layer, choice.rate_gbps = layer, rate
    for name in list(choice.gids):
        if name not in {p.name for p in choice.rails}:
            del choice.gids[name]
    return choice


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
