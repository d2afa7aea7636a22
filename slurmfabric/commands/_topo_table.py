"""Text rendering for ``slurmfabric topo``: plain aligned tables, no dependencies."""

from __future__ import annotations

from slurmfabric._common.sysfs import format_cpulist
from slurmfabric.plan import Plan
from slurmfabric.topology.model import Topology

FABRIC = {
    "ib": "InfiniBand",
    "roce": "RoCE",
    "efa": "AWS EFA (aws-ofi-nccl)",
    "gib": "GCP gIB",
    "tcpxo": "GCP TCPXO",
    "tcp": "TCP sockets only",
}


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = []
    for row in [headers, *rows]:
        lines.append(indent + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return lines


def _rate(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{int(value)}" if float(value).is_integer() else f"{value}"


def render(topo: Topology, plan: Plan, explain: bool = False) -> str:
    out: list[str] = [f"slurmfabric topo: {topo.root}", ""]
    rails = {p.name for p in plan.rails.rails}
    nearest = {b.gpu.index: f"{b.nic} {b.nic_distance}" for b in plan.bindings if b.gpu and b.nic}
    if topo.gpus:
        out.append(f"GPUs: {len(topo.gpus)} (from {topo.gpu_source})")
        out += _table(
            ["GPU", "BUS ID", "NUMA", "NAME", "NEAREST RAIL"],
            [
                [
                    str(g.index),
                    g.bus_id,
                    _numa(g.numa_node),
                    g.name or "-",
                    nearest.get(g.index, "-"),
                ]
                for g in topo.gpus
            ],
        )
    else:
        out.append("GPUs: none found (no NVIDIA PCI display/3D controllers in sysfs)")
    out.append("")
    if topo.ports:
        out.append(f"RDMA ports: {len(topo.ports)}")
        rows = []
        for dev in topo.rdma:
            for port in dev.ports:
                gid = plan.rails.gids.get(port.name)
                role = "rail" if port.name in rails else _role(plan.rails.excluded.get(port.name))
                rows.append(
                    [
                        port.name,
                        port.state,
                        _rate(port.rate_gbps),
                        port.link_layer,
                        _numa(dev.numa_node),
                        dev.pci.address if dev.pci else "-",
                        port.netdev or "-",
                        role,
                        str(gid.index) if gid else "-",
                    ]
                )
        out += _table(
            ["PORT", "STATE", "GB/S", "LINK", "NUMA", "PCI", "NETDEV", "ROLE", "GID"], rows
        )
    else:
        out.append("RDMA ports: none found (nothing in /sys/class/infiniband)")
    if topo.gpus and topo.rdma:
        out += ["", "GPU-NIC distance (nvidia-smi topo -m words)"]
        names = [d.name for d in topo.rdma]
        out += _table(
            ["", *names],
            [[f"GPU{g.index}", *[topo.distance(g, d) for d in topo.rdma]] for g in topo.gpus],
        )
    out.append("")
    numa = "; ".join(f"node{n.id} {format_cpulist(list(n.cpus))}" for n in topo.numa) or "none"
    out.append(f"NUMA: {numa}")
    out.append(f"Allowed CPUs: {format_cpulist(list(topo.allowed_cpus)) or '?'}")
    out.append(f"GPUDirect RDMA: {topo.gdr.mode} ({topo.gdr.evidence})")
    out.append(f"Fabric: {FABRIC.get(plan.fabric, plan.fabric)}")
    out.append("")
    if plan.nccl_env:
        out.append("NCCL settings:")
        out += [
            f"  {k}={v}" + ("   (user)" if k in plan.user_set else "")
            for k, v in plan.nccl_env.items()
        ]
    else:
        out.append("NCCL settings: none (NCCL's defaults apply)")
    out.append("")
    out.append("Per-rank binding:")
    out += _table(
        ["RANK", "GPU", "NIC", "CPUS", "MEM"],
        [
            [
                str(b.local_rank),
                "-" if b.gpu is None else str(b.gpu.index),
                b.nic or "-",
                format_cpulist(list(b.cpus)) or "-",
                "-" if b.mem_node is None else str(b.mem_node),
            ]
            for b in plan.bindings
        ],
    )
    if plan.warnings:
        out += ["", "Warnings:"] + [f"  ! {w}" for w in plan.warnings]
    if plan.errors:
        out += ["", "Errors:"] + [f"  X {e}" for e in plan.errors]
    if explain:
        out += ["", "Why:"]
        out += [f"  {k}: {why}" for k, why in plan.reasons.items()]
        out += [f"  note: {n}" for n in plan.notes]
        out += [f"  not a rail: {name}: {why}" for name, why in plan.rails.excluded.items()]
        out += [f"  rank {b.local_rank}: {b.reason}" for b in plan.bindings]
        out += [f"  discovery: {n}" for n in topo.notes]
    return "\n".join(out)


# Short ROLE words for ports that are not rails; --explain prints the full reason.
_ROLES = (
    ("on bond", "frontend"),
    ("nearest GPU", "storage/frontend"),
    ("port state", "unusable"),
    ("physical state", "unusable"),
    ("SR-IOV VF", "vf"),
    ("no uverbs", "no-uverbs"),
    ("no RoCE", "no-gid"),
    ("link layer", "other-link"),
    ("AWS EFA", "efa"),
)


def _role(reason: str | None) -> str:
    if reason is None:
        return "-"
    if "Gb/s; the rails run at" in reason:
        return "slower"
    return next((word for prefix, word in _ROLES if reason.startswith(prefix)), "excluded")


def _numa(node: int | None) -> str:
    return "-" if node is None else str(node)
