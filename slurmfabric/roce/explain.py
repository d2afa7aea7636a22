"""``topo --explain`` on a RoCE node: the traffic class NCCL's packets will carry and whether
it lands on a lossless (PFC) priority.

NCCL does not use rdma_cm, so rdma_cm's ``default_roce_tos`` does not reach it: its QPs
carry ``NCCL_IB_TC`` (NCCL environment variables doc; default 0), unless MLNX_OFED's
per-port ``tc/PORT/traffic_class`` sets one for every QP of the port (mlx5_ib
main_ext.c). The traffic class is the IP ToS byte of RoCE v2; a RoCE v1 GID has no IP
header, so under ``trust dscp`` its traffic cannot reach a DSCP-mapped priority.
"""

from __future__ import annotations

from slurmfabric.roce import parse
from slurmfabric.roce.facts import RocePort


def nccl_tos(port: RocePort, environ: dict[str, str]) -> tuple[int, str]:
    """The ToS byte NCCL's traffic on ``port`` will carry, and why."""
    if port.tos_source.endswith("/traffic_class") and port.roce_tos is not None:
        return port.roce_tos, f"the port's {port.tos_source}"
    text = environ.get("NCCL_IB_TC", "")
    if text.isdigit() and int(text) < 256:
        return int(text), "NCCL_IB_TC"
    return 0, "NCCL_IB_TC unset (NCCL's default 0)"


def lines(topo: object, plan: object, ports: list[RocePort],
          environ: dict[str, str]) -> list[str]:
    """The RoCE section: per rail, the settings seen and where NCCL's traffic lands."""
    hca = str(getattr(plan, "nccl_env", {}).get("NCCL_IB_HCA", "")).lstrip("=^")
    rails = {item.split(":")[0] for item in hca.split(",") if item}
    gid_text = getattr(plan, "nccl_env", {}).get("NCCL_IB_GID_INDEX")
    out = ["RoCE traffic (lossless check):"]
    for port in ports:
        if rails and port.device not in rails:
            continue
        pfc = [p for p, on in enumerate(port.pfc or ()) if on]
        tos, why = nccl_tos(port, environ)
        dscp, prio = parse.tos_priority(tos, port.dscp2prio)
        out.append(f"  {port.label()}: trust {port.trust or 'not seen'}, PFC on "
                   f"{pfc if port.pfc is not None else 'not seen'}, NCCL ToS {tos} ({why}) "
                   f"= DSCP {dscp} -> priority {prio}")
        gid_type = _gid_type(topo, port, gid_text)
        if gid_type == "IB/RoCE v1" and port.trust == "dscp":
            out.append(f"  warning: GID index {gid_text} of {port.name} is RoCE v1: no IP "
                       "header, so no DSCP; under trust dscp its traffic is not on a PFC "
                       "priority. Use a RoCE v2 GID")
        elif port.pfc is not None and port.trust == "dscp" and not port.pfc[prio]:
            out.append(f"  warning: NCCL's traffic on {port.name} lands on priority {prio}, "
                       f"which has no PFC (PFC on {pfc or 'no priority'}): lossy. Set "
                       f"NCCL_IB_TC to a ToS whose DSCP maps to a PFC priority (e.g. "
                       f"{_tos_for(pfc[0], port) if pfc else 106})")
        elif port.trust == "pcp" and port.pfc is not None and not port.pfc[0]:
            out.append(f"  warning: {port.name} trusts PCP and RoCE traffic is untagged "
                       "(priority 0, no PFC): lossy. Use trust dscp")
        for item in port.unseen:
            out.append(f"  not seen: {item}")
    return out if len(out) > 1 else []


def _gid_type(topo: object, port: RocePort, index: str | None) -> str | None:
    if index is None or not str(index).isdigit():
        return None
    for rdma_port in getattr(topo, "ports", ()) or ():
        if getattr(rdma_port, "name", None) == port.name:
            for gid in rdma_port.gids:
                if gid.index == int(index):
                    return gid.type
    return None


def _tos_for(prio: int, port: RocePort) -> int:
    """A ToS whose DSCP maps to ``prio`` (the lowest such DSCP), with ECT(0) set."""
    mapped = sorted(d for d, p in port.dscp2prio.items() if p == prio)
    dscp = mapped[0] if mapped else prio * 8
    return (dscp << 2) | 2
