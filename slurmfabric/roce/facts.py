"""What each RoCE port of this node is set to do, and the counters that tell congestion from
loss. Read under a sysfs root (fixture trees in tests), tools run with a deadline each.

Per RoCE port (an RDMA port whose link layer is Ethernet, with its netdev):

- MTU: ``/sys/class/net/IF/mtu``. RoCE's IB MTU is 4096 only when the netdev MTU leaves
  room for the 96 bytes of RoCE v2 headers (include/rdma/ib_addr.h iboe_get_mtu): 4192+.
- Trust and PFC: ``mlnx_qos -i IF`` (MLNX_OFED / mlnx-tools) when present, else iproute2
  ``dcb`` (the kernel DCB netlink interface both use), else MLNX_OFED's
  ``/sys/class/net/IF/qos/trust``; PFC else from ``ethtool -S``: mlx5 lists per-priority
  pause counters only for priorities with PFC on (kernel commit cf678570d5a1,
  "net/mlx5e: Add per priority group to PPort counters").
- ECN (DCQCN) per priority at the notification and reaction points: MLNX_OFED
  ``/sys/class/net/IF/ecn/roce_np/enable/0..7`` and ``roce_rp/enable/0..7`` (0/1), and
  ``roce_np/cnp_dscp`` (NVIDIA MLNX_OFED docs, "Explicit Congestion Notification").
  Upstream kernels keep DCQCN parameters in debugfs (drivers/infiniband/hw/mlx5/cong.c),
  which only root reads: reported as not seen.
- RoCE ToS: rdma_cm's ``/sys/kernel/config/rdma_cm/DEV/ports/P/default_roce_tos``
  (Documentation/ABI/testing/configfs-rdma_cm; the directory exists only once created) and
  MLNX_OFED's ``/sys/class/infiniband/DEV/tc/P/traffic_class`` (``Global tclass=N``).
- Counters: ``ethtool -S IF`` (pause per priority, pause duration and storms, discards,
  out-of-buffer; kernel Documentation/networking/device_drivers/ethernet/mellanox/mlx5/
  counters.rst) and ``/sys/class/infiniband/DEV/ports/P/hw_counters/`` (np_cnp_sent,
  rp_cnp_handled, out_of_sequence, packet_seq_err, local_ack_timeout_err, ...).

Whatever could not be read is listed in ``unseen`` with the reason: a check never guesses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from slurmfabric.roce import parse

# Counters kept (the rest of ethtool -S is hundreds of per-queue lines).
HW_COUNTERS = ("np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled",
               "rp_cnp_ignored", "out_of_buffer", "out_of_sequence", "packet_seq_err",
               "local_ack_timeout_err", "implied_nak_seq_err", "duplicate_request",
               "rnr_nak_retry_err", "roce_adp_retrans", "roce_slow_restart")
ETHTOOL_GLOBAL = ("rx_discards_phy", "tx_discards_phy", "rx_out_of_buffer",
                  "rx_buffer_passed_thres_phy", "rx_crc_errors_phy", "rx_symbol_err_phy",
                  "tx_pause_ctrl_phy", "rx_pause_ctrl_phy", "tx_global_pause",
                  "rx_global_pause", "tx_global_pause_duration", "rx_global_pause_duration",
                  "tx_pause_storm_warning_events", "tx_pause_storm_error_events")
_PER_PRIO = ("rx_prio{}_pause", "tx_prio{}_pause", "rx_prio{}_pause_duration",
             "tx_prio{}_pause_duration", "rx_prio{}_discards", "rx_prio{}_buf_discard",
             "rx_prio{}_cong_discard")
ETHTOOL_KEPT = frozenset(ETHTOOL_GLOBAL) | {
    name.format(p) for name in _PER_PRIO for p in range(parse.PRIORITIES)}


@dataclass
class RocePort:
    device: str  # mlx5_0
    port: int
    netdev: str | None
    mtu: int | None = None
    trust: str | None = None
    trust_source: str = ""
    pfc: tuple[bool, ...] | None = None
    pfc_source: str = ""
    dscp2prio: dict[int, int] = field(default_factory=dict)
    ecn_np: tuple[bool, ...] | None = None
    ecn_rp: tuple[bool, ...] | None = None
    cnp_dscp: int | None = None
    roce_tos: int | None = None
    tos_source: str = ""
    counters: dict[str, int] = field(default_factory=dict)
    unseen: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    def label(self) -> str:
        return f"{self.name} ({self.netdev})" if self.netdev else self.name

    def to_dict(self) -> dict:
        return {"device": self.device, "port": self.port, "netdev": self.netdev,
                "mtu": self.mtu, "trust": self.trust, "trust_source": self.trust_source,
                "pfc": None if self.pfc is None else [int(x) for x in self.pfc],
                "pfc_source": self.pfc_source,
                "dscp2prio": {str(k): v for k, v in sorted(self.dscp2prio.items())},
                "ecn_np": None if self.ecn_np is None else [int(x) for x in self.ecn_np],
                "ecn_rp": None if self.ecn_rp is None else [int(x) for x in self.ecn_rp],
                "cnp_dscp": self.cnp_dscp, "roce_tos": self.roce_tos,
                "tos_source": self.tos_source, "counters": dict(sorted(self.counters.items())),
                "unseen": list(self.unseen)}

    @classmethod
    def from_dict(cls, data: dict) -> RocePort:
        """Back from ``to_dict`` (an audit's per-node files); wrong shapes raise
        KeyError/TypeError/ValueError for the caller to report."""
        def bools(value):
            return None if value is None else tuple(bool(int(x)) for x in value)[:8]

        port = cls(str(data["device"]), int(data["port"]), data.get("netdev"))
        port.mtu = None if data.get("mtu") is None else int(data["mtu"])
        port.trust, port.trust_source = data.get("trust"), str(data.get("trust_source", ""))
        port.pfc, port.pfc_source = bools(data.get("pfc")), str(data.get("pfc_source", ""))
        port.dscp2prio = {int(k): int(v) for k, v in (data.get("dscp2prio") or {}).items()}
        port.ecn_np, port.ecn_rp = bools(data.get("ecn_np")), bools(data.get("ecn_rp"))
        port.cnp_dscp = None if data.get("cnp_dscp") is None else int(data["cnp_dscp"])
        port.roce_tos = None if data.get("roce_tos") is None else int(data["roce_tos"])
        port.tos_source = str(data.get("tos_source", ""))
        port.counters = {str(k): int(v) for k, v in (data.get("counters") or {}).items()}
        port.unseen = [str(u) for u in data.get("unseen") or []]
        return port


@dataclass
class Tools:
    """Paths of the tools (absolute in hooks, which run with no PATH); None: not used."""

    ethtool: str | None = "/usr/sbin/ethtool"
    mlnx_qos: str | None = "/usr/bin/mlnx_qos"
    dcb: str | None = "/usr/sbin/dcb"
    timeout: float = 5.0


def _read(root: str, path: str) -> str | None:
    from slurmfabric._common.sysfs import open_nonblocking  # a FIFO under --root must not block

    try:
        with open(os.path.join(root, path.lstrip("/")), errors="replace",
                  opener=open_nonblocking) as handle:
            return handle.read(4096).strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() and len(text) < 12 else None


def _run(tool: str | None, args: list[str], tools: Tools, what: str,
         unseen: list[str]) -> str | None:
    """A tool's stdout, or None with the reason in ``unseen`` (absent, failed, too slow)."""
    if not tool:
        return None
    if not os.path.exists(tool):
        return None  # not installed: the caller says what that leaves unseen
    from slurmfabric._common.probe import ProbeError, run_command

    try:
        out = run_command([tool, *args], tools.timeout)
    except ProbeError as error:
        unseen.append(f"{what}: {error}")
        return None
    if out.returncode != 0:
        last = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
        unseen.append(f"{what}: {os.path.basename(tool)} exit {out.returncode}: {last[:120]}")
        return None
    return out.stdout


def _per_prio(root: str, base: str) -> tuple[bool, ...] | None:
    values = [_read(root, f"{base}/{p}") for p in range(parse.PRIORITIES)]
    if any(v not in ("0", "1") for v in values):
        return None
    return tuple(v == "1" for v in values)


def roce_ports(root: str = "/") -> list[tuple[str, int, str | None]]:
    """(device, port, netdev) of every Ethernet-link-layer RDMA port, in discovery order."""
    from slurmfabric._common.sysfs import Root
    from slurmfabric.topology._io import Reader
    from slurmfabric.topology.rdma import discover_rdma

    return [(dev.name, p.port, p.netdev) for dev in discover_rdma(Reader(Root(root)),
                                                                   plan_only=True)
            for p in dev.ports if p.link_layer == "Ethernet"]


def collect_port(root: str, device: str, port: int, netdev: str | None,
                 tools: Tools) -> RocePort:
    facts = RocePort(device, port, netdev)
    unseen = facts.unseen
    ib = f"/sys/class/infiniband/{device}"
    hw = f"{ib}/ports/{port}/hw_counters"
    for name in HW_COUNTERS:
        value = _int(_read(root, f"{hw}/{name}"))
        if value is not None:
            facts.counters[name] = value
    tos = _int(_read(root, f"/sys/kernel/config/rdma_cm/{device}/ports/{port}/default_roce_tos"))
    tclass = parse.traffic_class(_read(root, f"{ib}/tc/{port}/traffic_class"))
    if tclass is not None:  # MLNX_OFED's per-port override wins over rdma_cm's default
        facts.roce_tos, facts.tos_source = tclass, f"{ib}/tc/{port}/traffic_class"
    elif tos is not None:
        facts.roce_tos, facts.tos_source = tos, "rdma_cm configfs default_roce_tos"
    else:
        unseen.append("RoCE ToS: no tc/traffic_class (MLNX_OFED) and no rdma_cm configfs "
                      f"entry for {device} (cma_roce_tos shows it)")
    if not netdev:
        unseen.append(f"{device}:{port} has no netdev: MTU, PFC, ECN and ethtool counters")
        return facts
    net = f"/sys/class/net/{netdev}"
    facts.mtu = _int(_read(root, f"{net}/mtu"))
    facts.ecn_np = _per_prio(root, f"{net}/ecn/roce_np/enable")
    facts.ecn_rp = _per_prio(root, f"{net}/ecn/roce_rp/enable")
    if facts.ecn_np is None or facts.ecn_rp is None:
        unseen.append(f"ECN: no {net}/ecn/roce_np|roce_rp/enable (MLNX_OFED sysfs); "
                      "upstream kernels keep DCQCN in debugfs")
    facts.cnp_dscp = _int(_read(root, f"{net}/ecn/roce_np/cnp_dscp"))
    stats_text = _run(tools.ethtool, ["-S", netdev], tools, "ethtool -S", unseen)
    stats = parse.ethtool_stats(stats_text) if stats_text else {}
    if stats_text is None and not any(u.startswith("ethtool") for u in unseen):
        unseen.append(f"counters: no ethtool at {tools.ethtool}")
    facts.counters.update({k: v for k, v in stats.items() if k in ETHTOOL_KEPT})
    qos_text = _run(tools.mlnx_qos, ["-i", netdev], tools, "mlnx_qos", unseen)
    if qos_text:
        view = parse.mlnx_qos(qos_text)
        facts.trust, facts.trust_source = view.trust, "mlnx_qos"
        facts.pfc, facts.pfc_source = view.pfc, "mlnx_qos"
        facts.dscp2prio = view.dscp2prio
    else:
        pfc_text = _run(tools.dcb, ["pfc", "show", "dev", netdev], tools, "dcb pfc", unseen)
        if pfc_text:
            facts.pfc, facts.pfc_source = parse.dcb_pfc(pfc_text), "dcb pfc"
        app_text = _run(tools.dcb, ["-N", "app", "show", "dev", netdev, "dscp-prio"], tools,
                        "dcb app", unseen)
        if app_text is not None:
            facts.dscp2prio = parse.dcb_app_dscp(app_text)
            # mlnx_qos's own rule on upstream kernels: trust is dscp when the DCB APP table
            # has DSCP entries (Mellanox/mlnx-tools python/mlnx_qos)
            facts.trust = "dscp" if facts.dscp2prio else "pcp"
            facts.trust_source = "dcb app"
    if facts.trust is None:
        trust = _read(root, f"{net}/qos/trust")  # MLNX_OFED
        if trust in ("dscp", "pcp"):
            facts.trust, facts.trust_source = trust, f"{net}/qos/trust"
        else:
            unseen.append("trust mode: no mlnx_qos, no dcb and no qos/trust in sysfs")
    if facts.pfc is None and stats:
        facts.pfc = tuple(f"rx_prio{p}_pause" in stats or f"tx_prio{p}_pause" in stats
                          for p in range(parse.PRIORITIES))
        facts.pfc_source = "ethtool -S (mlx5 lists pause counters of PFC priorities only)"
    if facts.pfc is None:
        unseen.append("PFC: no mlnx_qos, no dcb and no per-priority ethtool counters")
    return facts


def collect(root: str = "/", tools: Tools | None = None) -> list[RocePort]:
    tools = tools or Tools()
    return [collect_port(root, dev, port, netdev, tools)
            for dev, port, netdev in roce_ports(root)]
