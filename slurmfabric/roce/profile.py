"""The site's declared lossless RoCE profile and how a port differs from it.

A typical NVIDIA-style profile (Cumulus Linux RoCE defaults: RoCE DSCP 26 on switch
priority 3 with PFC, CNP DSCP 48 on priority 6; NVIDIA Network Operator "set trust to
dscp", "pfc for priority 3"): ``trust = "dscp"``, ``pfc_priorities = [3]``, ``ecn = true``,
``roce_tos = 106`` (DSCP 26 << 2 | ECT(0)), ``mtu = 4200`` (room for RoCE v2 headers around a
4096-byte IB MTU). Only the keys a site sets are checked.

Counter limits are per job (deltas between a job's prolog and epilog): loss (discards,
out-of-buffer, sequence errors, retransmit timeouts) and pause storms are the faults;
pause frames and CNPs are how a lossless fabric works, reported but not limited unless the
site sets a limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurmfabric.roce import parse
from slurmfabric.roce.facts import RocePort

# Default per-job limits: growth of these during a job means lost RoCE packets or a NIC that
# stopped draining (PFC storm). Names: kernel mlx5 counters.rst and RDMA hw_counters.
DEFAULT_DELTA_MAX = {
    "rx_discards_phy": 0, "tx_discards_phy": 0, "rx_out_of_buffer": 0, "out_of_buffer": 0,
    "out_of_sequence": 100, "packet_seq_err": 100, "local_ack_timeout_err": 0,
    "tx_pause_storm_warning_events": 0, "tx_pause_storm_error_events": 0,
    **{f"rx_prio{p}_discards": 0 for p in range(parse.PRIORITIES)},
    **{f"rx_prio{p}_buf_discard": 0 for p in range(parse.PRIORITIES)},
}
# What a sweep/audit ranks ports by: losses first, then the pause pressure.
LOSS = frozenset(DEFAULT_DELTA_MAX)
PAUSE = frozenset({f"{d}_prio{p}_pause{s}" for d in ("rx", "tx") for p in range(8)
                   for s in ("", "_duration")} | {"tx_global_pause", "rx_global_pause",
                                                   "tx_pause_ctrl_phy", "rx_pause_ctrl_phy"})
CONGESTION = frozenset({"np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets"})


@dataclass
class Profile:
    trust: str | None = None
    pfc_priorities: list[int] | None = None
    ecn: bool | None = None
    roce_tos: int | None = None
    mtu: int | None = None
    cnp_dscp: int | None = None
    delta_max: dict[str, int] = field(default_factory=dict)

    @property
    def lossless_priorities(self) -> list[int]:
        return list(self.pfc_priorities or [])


def _prios(flags: tuple[bool, ...] | None) -> list[int]:
    return [p for p, on in enumerate(flags or ()) if on]


def differences(port: RocePort, profile: Profile) -> list[str]:
    """One line per setting of ``port`` that differs from ``profile`` (what a drain
    reason names); settings that could not be read are in ``port.unseen``, not here."""
    out = []
    if profile.trust and port.trust and port.trust != profile.trust:
        out.append(f"trust {port.trust} (profile {profile.trust})")
    if profile.pfc_priorities is not None and port.pfc is not None:
        have = _prios(port.pfc)
        if have != sorted(profile.pfc_priorities):
            out.append(f"PFC on priorities {have or 'none'} (profile "
                       f"{sorted(profile.pfc_priorities)})")
    if profile.pfc_priorities and ("tx_global_pause" in port.counters
                                   or "rx_global_pause" in port.counters):
        out.append("802.3x global pause is on (ethtool -S lists global pause counters): "
                   "lossless RoCE uses PFC")
    if profile.ecn is not None:
        for point, flags in (("notification point (roce_np)", port.ecn_np),
                             ("reaction point (roce_rp)", port.ecn_rp)):
            if flags is None:
                continue
            for prio in profile.lossless_priorities or range(parse.PRIORITIES):
                if flags[prio] != profile.ecn:
                    out.append(f"ECN {'off' if profile.ecn else 'on'} at the {point} for "
                               f"priority {prio}")
    if profile.roce_tos is not None and port.roce_tos is not None \
            and port.roce_tos != profile.roce_tos:
        out.append(f"RoCE ToS {port.roce_tos} (profile {profile.roce_tos}; "
                   f"{port.tos_source})")
    if profile.mtu is not None and port.mtu is not None and port.mtu != profile.mtu:
        out.append(f"MTU {port.mtu} (profile {profile.mtu})")
    if profile.cnp_dscp is not None and port.cnp_dscp is not None \
            and port.cnp_dscp != profile.cnp_dscp:
        out.append(f"CNP DSCP {port.cnp_dscp} (profile {profile.cnp_dscp})")
    return out


def traffic_warning(port: RocePort, profile: Profile | None = None) -> str | None:
    """Where the port's RoCE traffic lands: its ToS gives a DSCP, the port's DSCP map a
    priority; a priority without PFC is lossy (what topo --explain warns about)."""
    if port.roce_tos is None or port.pfc is None:
        return None
    dscp, prio = parse.tos_priority(port.roce_tos, port.dscp2prio)
    if port.trust == "pcp":
        return (f"{port.label()}: trust pcp: the RoCE DSCP ({dscp}) is not used to pick a "
                "priority (untagged RoCE runs on priority 0"
                + ("" if port.pfc[0] else ", which has no PFC") + ")")
    if not port.pfc[prio]:
        want = profile.lossless_priorities if profile else _prios(port.pfc)
        return (f"{port.label()}: RoCE ToS {port.roce_tos} is DSCP {dscp}, priority {prio}, "
                f"which has no PFC (PFC on {_prios(port.pfc) or 'no priority'}"
                + (f"; profile {want}" if profile and want else "") + "): RoCE traffic is lossy")
    return None
