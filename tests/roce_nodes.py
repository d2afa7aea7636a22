"""RoCE fixture nodes and fake RoCE tools, built from the recorded outputs in
tests/fixtures/roce/ (each with its source in SOURCES.md).

The node is tests/fixtures/topology/nodes.py ``testbed_node(cpus, "Ethernet")``: two RoCE
rails mlx5_0/mlx5_1 (netdevs ens1np0, ens2np0) and an InfiniBand storage HCA. On top of it
this writes the MLNX_OFED sysfs a RoCE node has (file layout from the MLNX_OFED mlx5 driver,
values as the spiderpool query output shows them): ``ecn/roce_np|roce_rp/enable/0..7``,
``ecn/roce_np/cnp_dscp``, ``qos/trust``, ``tc/1/traffic_class`` (``Global tclass=N``), the
netdev MTU, and ``hw_counters`` named as ``rdma statistic`` lists them.

The fake ``ethtool``, ``mlnx_qos`` and ``dcb`` are shell scripts on PATH that print a
recorded output per node (``$SLURMD_NODENAME``, else ``local``) and interface, and fail like
the real tools when they have none. The lossless node's ``ethtool -S`` is *derived*: the
recorded PFC-off mlx5 ``grep prio`` output plus the four priority-3 pause counters mlx5 adds
when PFC is on priority 3 (names from the kernel's mlx5 counters.rst), and the loss
counters of the recorded ConnectX-6 Dx output.
"""

from __future__ import annotations

import os
from pathlib import Path

import fakesysfs
import nodes

FIX = Path(__file__).resolve().parent / "fixtures" / "roce"
CPUS = sorted(os.sched_getaffinity(0))
NETDEVS = {"mlx5_0": "ens1np0", "mlx5_1": "ens2np0"}
# The NVIDIA-style lossless profile (tests/fixtures/roce/SOURCES.md, "profile numbers").
PROFILE = {"trust": "dscp", "pfc_priorities": [3], "ecn": True, "roce_tos": 106,
           "mtu": 4200, "cnp_dscp": 48}


def recorded(name: str) -> str:
    return (FIX / name).read_text()


def hw_counter_names() -> list[str]:
    words = recorded("rdma_statistic_mlx5_hw_counters.txt").split()
    return [w for w, v in zip(words, words[1:]) if v.isdigit() and not w.isdigit()]


def ethtool_lossless(loss: dict[str, int] | None = None, pause: int = 0) -> str:
    """Derived (see the module docstring): PFC on priority 3 and the CX6 Dx loss counters."""
    out = ["NIC statistics:"]
    cx6 = {k: v for k, v in (ln.strip().split(": ") for ln in recorded(
        "ethtool_mlx5_cx6dx_global_pause_discards.txt").splitlines()[1:] if ": " in ln)}
    for key in ("rx_discards_phy", "rx_out_of_buffer", "rx_buffer_passed_thres_phy"):
        out.append(f"     {key}: {(loss or {}).get(key, int(cx6[key]))}")
    for line in recorded("ethtool_mlx5_grep_prio_no_pfc.txt").splitlines():
        out.append(line)
        if line.strip().startswith("tx_prio3_packets"):
            out += [f"     rx_prio3_pause: {pause}", f"     rx_prio3_pause_duration: {pause}",
                    f"     tx_prio3_pause: {pause}", f"     tx_prio3_pause_duration: {pause}"]
    return "\n".join(out) + "\n"


def build(root: Path, *, mtu: int = 4200, ecn: dict[str, list[int]] | None = None,
          tclass: int | None = 106, trust: str | None = "dscp",
          hw: dict[str, int] | None = None) -> Path:
    """The RoCE node under ``root``; ``ecn``: per netdev, the priorities whose np and rp
    ECN switches read 0 (all read 1 otherwise, as in the spiderpool recording)."""
    fakesysfs.build(nodes.testbed_node(CPUS, "Ethernet"), root)
    names = hw_counter_names()
    for dev, netdev in NETDEVS.items():
        net = root / "sys/class/net" / netdev
        (net / "mtu").write_text(f"{mtu}\n")
        for point in ("roce_np", "roce_rp"):
            enable = net / "ecn" / point / "enable"
            enable.mkdir(parents=True, exist_ok=True)
            for prio in range(8):
                off = prio in (ecn or {}).get(netdev, [])
                (enable / str(prio)).write_text("0\n" if off else "1\n")
        (net / "ecn/roce_np/cnp_dscp").write_text("48\n")
        if trust:
            (net / "qos").mkdir(exist_ok=True)
            (net / "qos/trust").write_text(f"{trust}\n")
        ib = root / "sys/class/infiniband" / dev
        (ib / "tc/1").mkdir(parents=True, exist_ok=True)
        (ib / "tc/1/traffic_class").write_text(
            f"Global tclass={tclass}\n" if tclass is not None else "")
        counters = ib / "ports/1/hw_counters"
        counters.mkdir(parents=True, exist_ok=True)
        for name in names:
            (counters / name).write_text(f"{(hw or {}).get(name, 0)}\n")
    return root


def outputs(base: Path, node: str, netdev: str, *, ethtool: str | None = None,
            mlnx_qos: str | None = "mlnx_qos_trust_dscp_pfc3.txt",
            dcb_pfc: str | None = None, dcb_app: str | None = None) -> None:
    """What the fake tools print on ``node`` for ``netdev`` (recorded file names, or the
    text itself for ethtool)."""
    where = base / node
    where.mkdir(parents=True, exist_ok=True)
    files = {"ethtool": ethtool if ethtool is not None else ethtool_lossless(),
             "mlnx_qos": recorded(mlnx_qos) if mlnx_qos else None,
             "dcb-pfc": recorded(dcb_pfc) if dcb_pfc else None,
             "dcb-app": recorded(dcb_app) if dcb_app else None}
    for tool, text in files.items():
        path = where / f"{tool}-{netdev}.txt"
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)


_SCRIPTS = {
    # ethtool -S IF
    "ethtool": 'f="$D/ethtool-$2.txt"; [ "$1" = -S ] && [ -f "$f" ] && exec cat "$f"\n'
               'echo "Cannot get stats strings information: Operation not supported" >&2; '
               "exit 94",
    # mlnx_qos -i IF
    "mlnx_qos": 'f="$D/mlnx_qos-$2.txt"; [ -f "$f" ] && exec cat "$f"\n'
                'echo "Interface $2 not found" >&2; exit 1',
    # dcb pfc show dev IF | dcb -N app show dev IF dscp-prio
    "dcb": 'if [ "$1" = pfc ]; then f="$D/dcb-pfc-$4.txt"; else f="$D/dcb-app-$5.txt"; fi\n'
           '[ -f "$f" ] && exec cat "$f"\necho "Attribute not supported" >&2; exit 1',
}


def tools(bin_dir: Path, base: Path) -> dict[str, str]:
    """The fake tools; returns the health config keys that point at them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, body in _SCRIPTS.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nD="{base}/${{SLURMD_NODENAME:-local}}"\n{body}\n')
        path.chmod(0o755)
        paths[name] = str(path)
    return paths


def healthy(tmp: Path, node: str = "local", **build_args) -> tuple[Path, dict[str, str]]:
    """A lossless node: its root and the tool paths."""
    root = build(tmp / "root" / node, **build_args)
    for netdev in NETDEVS.values():
        outputs(tmp / "out", node, netdev)
    return root, tools(tmp / "bin", tmp / "out")
