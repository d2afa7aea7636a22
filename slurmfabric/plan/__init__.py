"""The NCCL/NUMA plan: a pure function of a Topology that says what to set, and why.

``make_plan(topo, local_world_size, ...)`` returns NCCL environment settings with a
one-line reason each, warnings, and one ``RankBinding`` per local rank. The user's own
NCCL_* values always win and are reported as such. Standard library only: it runs on
every rank.
"""

from __future__ import annotations

from slurmfabric._common.record import Record
from slurmfabric.plan import contract
from slurmfabric.plan.placement import RankBinding, place_ranks
from slurmfabric.plan.rails import RailChoice, choose_rails, gid_index
from slurmfabric.topology.model import Topology, distance_rank
from slurmfabric.topology.net import parse_ipv4, route_to

__all__ = ["Plan", "RankBinding", "make_plan", "parse_nccl_version", "visible_gpus_from_env"]

# NCCL >= 2.21 picks the RoCE GID itself (first configured, non-link-local, RoCE v2, IPv4
# unless NCCL_IB_ADDR_FAMILY=AF_INET6); older NCCL defaults to index 0 (NCCL env docs,
# docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-gid-index).
AUTO_GID_SINCE = (2, 21)


class Plan(Record):
    """Mutable while ``make_plan`` fills it in; a Record, not a dataclass (start-up cost)."""

    __slots__ = (
        "fabric", "nccl_env", "reasons", "warnings", "notes", "bindings", "rails", "user_set",
        "errors", "summary", "fabric_type",
    )  # fmt: skip
    _factories = {
        "nccl_env": dict, "reasons": dict, "warnings": list, "notes": list, "bindings": list,
        "rails": RailChoice, "user_set": dict, "errors": list,
    }  # fmt: skip
    _defaults = {"summary": "", "fabric_type": "auto"}
    _frozen = False
    fabric: str  # "ib", "roce", "efa", "gib", "tcpxo", "tcp"
    nccl_env: dict[str, str]
    reasons: dict[str, str]
    warnings: list[str]
    notes: list[str]  # decisions to leave things to NCCL
    bindings: list[RankBinding]
    rails: RailChoice
    user_set: dict[str, str]  # NCCL_* the user set already
    errors: list[str]  # the node cannot honour fabric_type (env/launch refuse to start)
    summary: str  # what the node offers, one line ("8 InfiniBand rail ports (...)")
    fabric_type: str  # the job's fabric.type this plan was made for

    def binding(self, local_rank: int) -> RankBinding:
        return self.bindings[local_rank]

    def to_dict(self) -> dict[str, object]:
        return {
            "fabric": self.fabric,
            "fabric_type": self.fabric_type,
            "summary": self.summary,
            "errors": list(self.errors),
            "nccl_env": dict(self.nccl_env),
            "reasons": dict(self.reasons),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "rails": [p.name for p in self.rails.rails],
            "excluded": dict(self.rails.excluded),
            "gids": {name: g.index for name, g in self.rails.gids.items()},
            "user_set": dict(self.user_set),
            "bindings": [b.to_dict() for b in self.bindings],
        }


def parse_nccl_version(value: object) -> tuple[int, ...] | None:
    """``"2.21.5"``, ``(2, 21, 5)`` or NCCL's integer code 22105 -> (2, 21, 5)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(int(v) for v in value)
    text = str(value).strip()
    if text.isdigit() and len(text) >= 5:  # ncclGetVersion: major*10000 + minor*100 + patch
        code = int(text)
        return (code // 10000, (code % 10000) // 100, code % 100)
    try:
        return tuple(int(p) for p in text.split("+")[0].split(".") if p != "")
    except ValueError:
        return None


def visible_gpus_from_env(env: dict[str, str]) -> list[str] | None:
    """Absolute GPU numbers for this step: SLURM_STEP_GPUS / SLURM_JOB_GPUS first (device
    minors), then CUDA_VISIBLE_DEVICES or ROCm's ROCR_/HIP_VISIBLE_DEVICES (relative to
    the cgroup when Slurm constrains devices, so only trusted when the Slurm variables are
    absent)."""
    for key in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES",
                "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = env.get(key)
        if value is not None and value.strip() not in ("", "NoDevFiles"):
            return [v for v in value.split(",") if v.strip()]
    return None


def _resolve(addr: str) -> str | None:
    if parse_ipv4(addr) is not None:
        return addr
    if ":" in addr:
        import ipaddress  # IPv6 literals only: ipaddress costs ~1.5 ms on every rank

        try:
            ipaddress.ip_address(addr)
            return addr
        except ValueError:
            pass
    # _socket, not socket: the wrapper module imports enum/selectors (~5 ms); the tuple
    # getaddrinfo returns is the same, only its family/type fields are plain ints here.
    # An ASCII name goes in as bytes: a str is IDNA-encoded first, which imports
    # encodings.idna, unicodedata and re (~6 ms).
    import _socket

    host: str | bytes = addr.encode("ascii") if addr.isascii() else addr
    try:
        return _socket.getaddrinfo(host, None)[0][4][0]
    except (OSError, IndexError, UnicodeError):
        return None


def make_plan(
    topo: Topology,
    local_world_size: int,
    *,
    allowed_cpus: object = None,
    visible_gpus: list[str] | None = None,
    master_addr: str | None = None,
    user_env: dict[str, str] | None = None,
    nccl_version: object = None,
    fabric_type: str = "auto",
    node: str = "",
) -> Plan:
    """The plan for ``topo`` under the job's ``fabric_type`` (see plan/contract.py)."""
    user_env = dict(user_env or {})
    version = parse_nccl_version(nccl_version)
    family = user_env.get("NCCL_IB_ADDR_FAMILY") or None
    addr_range, vlan, policy_problems = gid_policy_from_env(user_env)
    choice = choose_rails(topo, family, addr_range=addr_range, vlan=vlan)
    plan = Plan(fabric="tcp", rails=choice, fabric_type=contract.check_type(fabric_type))
    plan.warnings.extend(policy_problems)
    plan.warnings.extend(choice.warnings)
    plan.notes.extend(choice.notes)
    _hidden_pcie(plan, topo)
    want: dict[str, tuple[str, str]] = {}  # var -> (value, reason)

    if "gib" in topo.markers or "tcpxo" in topo.markers:
        kind = "gib" if "gib" in topo.markers else "tcpxo"
        plan.fabric = kind
        plan.summary = f"GCP {'gIB' if kind == 'gib' else 'TCPXO'} ({topo.markers[kind]})"
        plan.notes.append(
            f"GCP {'gIB' if kind == 'gib' else 'TCPXO'} node: source {topo.markers[kind]} "
            "(it sets NCCL_NET, plugin paths and tuning); slurmfabric sets no NCCL_IB_* here"
        )
    elif any(d.is_efa for d in topo.rdma):
        plan.fabric = "efa"
        efa = [d.name for d in topo.rdma if d.is_efa]
        shown = ", ".join(efa[:4]) + (", ..." if len(efa) > 4 else "")
        plan.summary = f"{len(efa)} AWS EFA devices ({shown})"
        plan.notes.append(
            f"AWS EFA ({len(efa)} devices): no NCCL_IB_* at all; the aws-ofi-nccl plugin "
            "picks the NICs and sets its own topology and tuning"
        )
        if "aws-ofi-nccl" not in topo.markers:
            plan.warnings.append(
                "EFA devices but no aws-ofi-nccl plugin found under /opt/amazon/ofi-nccl: NCCL "
                "will use TCP sockets unless the plugin is on LD_LIBRARY_PATH"
            )
    elif choice.rails:
        plan.fabric = "ib" if choice.link_layer == "InfiniBand" else "roce"
        names = ",".join(p.name for p in choice.rails)
        plan.summary = f"{len(choice.rails)} {choice.link_layer} rail ports ({names})"
        _rdma_env(plan, choice, version, family, want)
    else:
        total = len(topo.ports)
        counts: dict[str, int] = {}
        for reason in choice.excluded.values():
            counts[reason] = counts.get(reason, 0) + 1
        why = (
            f"all {total} RDMA ports are unusable ("
            + "; ".join(f"{n} x {reason}" for reason, n in _most_common(counts))
            + ")"
            if total
            else "no RDMA devices in /sys/class/infiniband"
        )
        plan.summary = why
        plan.warnings.append(
            f"TCP ONLY: {why}. NCCL will use TCP sockets between nodes, "
            "typically 10-50x slower than RDMA"
        )

    if master_addr:
        _socket_ifname(plan, topo, master_addr, want)
    else:
        plan.notes.append("no master address given: NCCL_SOCKET_IFNAME left to NCCL")

    allowed = (
        tuple(sorted(int(c) for c in allowed_cpus))
        if allowed_cpus is not None
        else topo.allowed_cpus
    )
    # Each rank's nearest NIC: a rail (on EFA nodes an ACTIVE EFA device, which
    # aws-ofi-nccl also prefers per GPU and the binding follows).
    plan.bindings = place_ranks(
        topo, local_world_size, choice.rails, allowed, visible_gpus, plan.warnings
    )
    _down_rails(plan, topo)
    if plan.fabric in ("ib", "roce") and plan.fabric_type != "tcp":
        _gdr_level(plan, topo, want)
    if plan.fabric == "ib" and "sharp" in topo.markers:
        _collnet(plan, topo, user_env)
    contract.node_wants(plan.fabric_type, plan, want, node or "(this node)")
    plan.warnings.extend(
        f"{line} (fabric.type={plan.fabric_type}; set in the environment)"
        for line in contract.conflicts(plan.fabric_type, user_env)
    )
    _apply_user(plan, want, user_env)
    _check_user_hca(plan, topo, user_env)
    return plan


ROCE_VLAN_ENV = "SLURMFABRIC_ROCE_VLAN"


def gid_policy_from_env(env: dict[str, str]) -> tuple[str | None, int | None, list[str]]:
    """The site's RoCE GID choice: NCCL_IB_ADDR_RANGE (the rail subnet, e.g. 10.1.0.0/16;
    NCCL >= 2.21 applies it too, NCCL env docs) and SLURMFABRIC_ROCE_VLAN (the VLAN id of
    the netdev carrying that subnet, 0 = untagged). Unusable values are warned about and
    ignored, never fatal on a rank."""
    problems: list[str] = []
    addr_range = (env.get("NCCL_IB_ADDR_RANGE") or "").strip() or None
    if addr_range:
        from slurmfabric.plan.rails import GidPolicy

        try:
            GidPolicy(addr_range)
        except ValueError:
            problems.append(f"NCCL_IB_ADDR_RANGE={addr_range!r} is not a CIDR range: ignored "
                            "when choosing RoCE GIDs")
            addr_range = None
    text = (env.get(ROCE_VLAN_ENV) or "").strip()
    vlan = int(text) if text.isdigit() and int(text) <= 4094 else None
    if text and vlan is None:
        problems.append(f"{ROCE_VLAN_ENV}={text!r} is not a VLAN id 0-4094: ignored")
    return addr_range, vlan, problems


def _down_rails(plan: Plan, topo: Topology) -> None:
    """Name each rail whose port is not up, and what its GPUs use instead: without this the
    only trace is a GPU far from its NIC."""
    for port in plan.rails.down:
        dev = topo.device(port.device)
        line = (f"rail {port.name} is down ({port.state}/{port.phys_state}): left out of the "
                "rails")
        moved = []
        for b in plan.bindings:
            if b.gpu is None or dev is None:
                continue
            here = distance_rank(topo.distance(b.gpu, dev))
            if here < distance_rank(b.nic_distance):
                moved.append(f"GPU {b.gpu.index} uses {b.nic or 'no RDMA NIC'}"
                             f"{f' ({b.nic_distance})' if b.nic else ''} instead of "
                             f"{port.name} ({topo.distance(b.gpu, dev)})")
        if moved:
            line += "; " + "; ".join(moved)
        elif dev is not None and topo.gpus:
            near = [g.index for g in topo.gpus if distance_rank(topo.distance(g, dev)) <= 1]
            if near:
                line += f"; its GPUs {near} have no rank here"
        plan.warnings.append(line)


def _collnet(plan: Plan, topo: Topology, user_env: dict[str, str]) -> None:
    """SHARP (CollNet) is planned only when the user turns it on: the node can show the
    plugin, but not whether the fabric runs a SHARP aggregation manager, and CollNet without
    one fails or hangs (NVIDIA/nccl-tests#311, tests/fixtures/nccl/versions/)."""
    path = topo.markers["sharp"]
    if user_env.get("NCCL_COLLNET_ENABLE") == "1":
        plan.notes.append(f"SHARP plugin {path} and NCCL_COLLNET_ENABLE=1: CollNet on as asked; "
                          "'slurmfabric nccl-log' shows whether channels used COLLNET/SHARP")
    else:
        plan.notes.append(
            f"SHARP plugin {path} found; CollNet left off (NCCL_COLLNET_ENABLE unset): set it "
            "to 1 where the fabric runs a SHARP aggregation manager (sharp_am on the UFM / "
            "subnet manager host; check with sharp_hello)"
        )


def _hidden_pcie(plan: Plan, topo: Topology) -> None:
    """Say where GPU-NIC pairs come from when sysfs shows no PCIe tree (topology/nccl_topo)."""
    if not topo.markers.get("pcie_hidden"):
        return
    path = topo.markers.get("nccl_topo_file")
    if path:
        plan.notes.append(
            "PCIe tree hidden (every GPU and NIC alone in its own PCI domain, a VM): GPU-NIC "
            f"pairs from the NCCL topology file {path} (set in "
            f"{topo.markers.get('nccl_topo_source', '?')}), which NCCL reads too"
        )
    else:
        plan.warnings.append(
            "PCIe tree hidden (every GPU and NIC alone in its own PCI domain, e.g. a Hyper-V "
            "VM) and no NCCL topology file: neither NCCL nor the binding can pair GPUs with "
            "their NICs; set NCCL_TOPO_FILE to the image's topology XML" + _topo_file_hint(topo)
        )


# Azure HPC images' NCCL topology files (github.com/Azure/azhpc-images topology/): ND A100
# v4 and ND H100/H200 v5, NVIDIA GPUs only. An AMD GPU VM (ND MI300X v5) is not described
# by them: naming them there sends RCCL to a file of another machine.
_AZURE_TOPO_FILES = (("A100", "/opt/microsoft/ndv4/topo.xml"),
                     ("H100", "/opt/microsoft/ndv5/topo.xml"),
                     ("H200", "/opt/microsoft/ndv5/topo.xml"))


def _topo_file_hint(topo: Topology) -> str:
    """Where such a file is, only for the GPUs it describes."""
    names = " ".join(g.name or "" for g in topo.gpus)
    files = sorted({path for model, path in _AZURE_TOPO_FILES if model in names})
    if files:
        return f" (Azure HPC images: {', '.join(files)})"
    if names and "NVIDIA" not in names:
        return " (RCCL reads NCCL_TOPO_FILE too; no published file is known for these GPUs)"
    return (" (Azure HPC images, NVIDIA GPUs: /opt/microsoft/ndv4/topo.xml for ND A100 v4, "
            "/opt/microsoft/ndv5/topo.xml for ND H100/H200 v5)")


def _most_common(counts: dict[str, int]) -> list[tuple[str, int]]:
    """Counter.most_common without collections: by count, ties in first-seen order."""
    return sorted(counts.items(), key=lambda item: item[1], reverse=True)


def _rdma_env(
    plan: Plan, choice: RailChoice, version: tuple[int, ...] | None, family: str | None, want: dict
) -> None:
    names = [p.name for p in choice.rails]
    rate = (
        f"{int(choice.rate_gbps)}"
        if choice.rate_gbps and choice.rate_gbps.is_integer()
        else str(choice.rate_gbps)
    )
    want["NCCL_IB_HCA"] = (
        "=" + ",".join(names),
        f"{len(names)} ACTIVE {choice.link_layer} ports at {rate} Gb/s within PXB of a GPU; "
        f"exact names ('=') so mlx5_1 cannot also match mlx5_10; "
        f"{len(choice.excluded)} other ports left out (see --explain)",
    )
    if choice.link_layer != "Ethernet":
        plan.notes.append("InfiniBand link layer: no GID index needed (NCCL addresses by LID)")
        return
    if choice.family == "AF_INET6" and family is None:
        want["NCCL_IB_ADDR_FAMILY"] = (
            "AF_INET6",
            "the rail ports have RoCE v2 GIDs with IPv6 addresses only",
        )
    index, odd = gid_index(choice)
    if odd:
        plan.warnings.append(
            f"RoCE GID index differs between rail ports ({', '.join(odd)} differ from index "
            f"{index}); NCCL < 2.21 uses one index for every port"
        )
    by_vlan = choice.gid_policy is not None and "VLAN" in choice.gid_policy
    if version is not None and version >= AUTO_GID_SINCE and not (by_vlan and index is not None):
        plan.notes.append(
            f"NCCL {'.'.join(map(str, version))} picks the RoCE GID itself "
            f"(would be index {index}): NCCL_IB_GID_INDEX left unset"
        )
    elif index is not None:
        kind = "IPv6" if choice.family == "AF_INET6" else "IPv4-mapped"
        seen = "unknown" if version is None else ".".join(map(str, version))
        why = (f"NCCL {seen} (< 2.21 or unknown) would default to index 0"
               if not (version is not None and version >= AUTO_GID_SINCE)
               else f"NCCL {seen} would pick the first routable GID, not the site's VLAN")
        on = f" on {choice.gid_policy}" if choice.gid_policy else ""
        want["NCCL_IB_GID_INDEX"] = (
            str(index),
            f"RoCE v2 {kind} non-link-local GID{on} on {len(choice.gids) - len(odd)} rail "
            f"ports; {why}",
        )


def _socket_ifname(plan: Plan, topo: Topology, master_addr: str, want: dict) -> None:
    address = _resolve(master_addr)
    if address is None:
        plan.warnings.append(
            f"cannot resolve master address {master_addr!r}: NCCL_SOCKET_IFNAME left unset"
        )
        return
    iface, why = route_to(address, topo.netdevs, topo.routes)
    if iface is None or iface == "lo":
        plan.warnings.append(f"{why}: NCCL_SOCKET_IFNAME left unset")
        return
    want["NCCL_SOCKET_IFNAME"] = (
        f"={iface}",
        f"{why}; exact name ('=') so 'eth' cannot match virbr0-like names",
    )
    if plan.fabric == "tcp":
        idle = [n.name for n in topo.netdevs if n.pci_address and n.name != iface
                and n.operstate == "up" and n.master is None and n.type == 1]
        if idle:
            # GCP A3 High/Mega: 4 or 8 gVNICs beside the GPUs carry GPUDirect-TCPX/TCPXO,
            # which only Google's net plugin drives (cloud.google.com/compute/docs/gpus/
            # gpudirect); without it NCCL's sockets send everything through one NIC
            plan.notes.append(
                f"TCP on {iface} only: {len(idle)} more physical NICs are up "
                f"({', '.join(idle)}) and carry no NCCL traffic; on a GPUDirect-TCPX/TCPXO "
                "VM they need the cloud's NCCL net plugin"
            )


def _gdr_level(plan: Plan, topo: Topology, want: dict) -> None:
    dists = [b.nic_distance for b in plan.bindings if b.nic_distance]
    if topo.gdr.mode == "none":
        plan.warnings.append(f"GPUDirect RDMA unavailable: {topo.gdr.evidence}")
        return
    if dists and all(d == "PHB" for d in dists):
        want["NCCL_NET_GDR_LEVEL"] = (
            "PHB",
            "every GPU's nearest rail NIC is PHB (through the CPU root complex); NCCL's default "
            "PXB (src/graph/paths.cc ncclTopoCheckGdr) would turn GPUDirect RDMA off",
        )
    elif dists and topo.coherent_gpus:
        plan.notes.append(
            f"GPUs attached coherently ({topo.coherent_gpus}): "
            "NCCL_NET_GDR_LEVEL not set; NCCL >= 2.22 takes GPUDirect RDMA through C2C "
            "(NCCL_NET_GDR_C2C, NCCL's environment variables doc)"
        )
    elif dists and any(distance_rank(d) > 1 for d in dists):
        far = sorted(
            {b.gpu.index for b in plan.bindings if b.gpu and distance_rank(b.nic_distance) > 1}
        )
        plan.warnings.append(
            f"GPUs {far} have no rail NIC within PXB: their traffic crosses the CPU "
            "without GPUDirect RDMA"
        )
    else:
        plan.notes.append(
            f"NCCL_NET_GDR_LEVEL left at NCCL's default PXB: rail NICs are {sorted(set(dists))}"
        )


def _apply_user(plan: Plan, want: dict, user_env: dict[str, str]) -> None:
    for key, value in user_env.items():
        if key.startswith("NCCL_"):
            plan.user_set[key] = value
    for key, (value, why) in want.items():
        if key in user_env:
            mine = "same value" if user_env[key] == value else f"slurmfabric would set {value!r}"
            plan.nccl_env[key] = user_env[key]
            plan.reasons[key] = f"set by the user ({mine}: {why})"
        else:
            plan.nccl_env[key] = value
            plan.reasons[key] = why


def _check_user_hca(plan: Plan, topo: Topology, user_env: dict[str, str]) -> None:
    """Warn about a user NCCL_IB_HCA whose bare prefixes match more than meant (NCCL env docs,
    NCCL_IB_HCA: plain names are prefixes, "=" means exact)."""
    value = user_env.get("NCCL_IB_HCA")
    if not value:
        return
    body = value.lstrip("^")
    if body.startswith("="):
        return
    names = {d.name for d in topo.rdma}
    for entry in body.split(","):
        dev = entry.split(":")[0]
        extra = sorted(n for n in names if n != dev and n.startswith(dev))
        if extra:
            plan.warnings.append(
                f"NCCL_IB_HCA={value!r}: the prefix {dev!r} also matches {', '.join(extra)}; "
                f"write '={value.lstrip('^')}' for exact names"
            )
