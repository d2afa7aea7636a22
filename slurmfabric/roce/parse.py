"""Parsers for the tools a RoCE checklist reads. Pure functions of the text; formats from the
tools' sources and recorded real output (tests/fixtures/roce/SOURCES.md).

- ``ethtool -S IF``: ``NIC statistics:`` then ``     name: value`` lines.
- ``mlnx_qos -i IF`` (Mellanox/mlnx-tools python/mlnx_qos): ``Priority trust state: dscp``,
  a ``dscp2prio mapping:`` block only under trust dscp (one priority may wrap onto two
  lines), ``PFC configuration:`` with a ``priority 0 1 ... 7`` row and an ``enabled`` row
  (tabs or spaces, trailing spaces), ``tc: N ratelimit: ..., tsa: ets|strict|vendor`` lines.
- iproute2 ``dcb pfc show dev IF`` (dcb-pfc(8)): ``prio-pfc 0:off 1:off 2:off 3:on ...``;
  ``dcb -N app show dev IF dscp-prio`` (dcb-app(8)): ``dscp-prio 0:0 24:3 48:6``.
- MLNX_OFED ``/sys/class/infiniband/DEV/tc/PORT/traffic_class``: empty until set, then
  ``Global tclass=N`` (mlx5_ib main_ext.c).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PRIORITIES = 8


def ethtool_stats(text: str) -> dict[str, int]:
    """``ethtool -S`` -> {counter: value}; lines that are not ``name: integer`` are skipped
    (a driver's free-form header, a truncated last line)."""
    out: dict[str, int] = {}
    for line in text.splitlines()[:20_000]:
        name, sep, value = line.strip().partition(":")
        value = value.strip()
        if sep and name and " " not in name and value.isascii() and value.isdigit() \
                and len(value) < 24:
            out[name] = int(value)
    return out


@dataclass
class QosView:
    """What ``mlnx_qos -i`` (or ``dcb``) says about one interface."""

    trust: str | None = None  # "dscp" | "pcp"
    pfc: tuple[bool, ...] | None = None  # per priority 0..7
    dscp2prio: dict[int, int] = field(default_factory=dict)
    tsa: dict[int, str] = field(default_factory=dict)  # tc -> "ets, bw: 10%" | "strict" ...
    prio_tc: dict[int, int] = field(default_factory=dict)  # priority -> tc


def mlnx_qos(text: str) -> QosView:
    view = QosView()
    lines = text.splitlines()[:2000]
    mapping_prio: int | None = None
    tc: int | None = None
    for i, raw in enumerate(lines):
        line = raw.strip()
        if line.startswith("Priority trust state:"):
            value = line.split(":", 1)[1].strip().lower()
            view.trust = value if value in ("dscp", "pcp") else value or None
        m = re.match(r"^prio:(\d)\s+dscp:([\d,\s]*)$", line)
        if m:
            mapping_prio = int(m.group(1))
            _dscps(view, mapping_prio, m.group(2))
            continue
        if mapping_prio is not None and re.match(r"^[\d,]+,$", line):  # a wrapped line
            _dscps(view, mapping_prio, line)
            continue
        mapping_prio = None
        if re.match(r"^priority\s+0\s+1\s+2\s+3\s+4\s+5\s+6\s+7$", line):
            for follow in lines[i + 1:i + 4]:
                parts = follow.split()
                if parts[:1] == ["enabled"] and len(parts) == 1 + PRIORITIES \
                        and all(p in ("0", "1") for p in parts[1:]):
                    view.pfc = tuple(p == "1" for p in parts[1:])
                    break
        m = re.match(r"^tc:\s*(\d{1,3})\s+ratelimit:[^,]*,\s*tsa:\s*(.+)$", line)
        if m:
            tc = int(m.group(1))
            view.tsa[tc] = m.group(2).strip()
            continue
        m = re.match(r"^priority:\s*(\d)$", line)
        if m and tc is not None:
            view.prio_tc[int(m.group(1))] = tc
    return view


def _dscps(view: QosView, prio: int, text: str) -> None:
    for item in text.replace(" ", "").split(","):
        if item.isdigit() and int(item) < 64:
            view.dscp2prio[int(item)] = prio


def _output(text: str) -> str:
    """A transcript's output lines (a ``# dcb ...`` prompt line is the command, not output)."""
    return "\n".join(ln for ln in text.splitlines()[:2000] if not ln.lstrip().startswith("#"))


def dcb_pfc(text: str) -> tuple[bool, ...] | None:
    """``prio-pfc 0:off ... 7:on`` (released iproute2; ``pg-pfc`` before the release)."""
    m = re.search(r"\b(?:prio|pg)-pfc((?:\s+\d:(?:on|off))+)", _output(text))
    if not m:
        return None
    states = dict(item.split(":") for item in m.group(1).split())
    if sorted(states) != [str(p) for p in range(PRIORITIES)]:
        return None
    return tuple(states[str(p)] == "on" for p in range(PRIORITIES))


def dscp_value(name: str) -> int | None:
    """A DSCP as dcb prints it: a number (``-N``) or iproute2's rt_dsfield name (CS0-CS7,
    AF11-AF43, EF; RFC 2474, RFC 2597, RFC 3246)."""
    if name.isdigit():
        return int(name) if int(name) < 64 else None
    m = re.fullmatch(r"CS([0-7])|AF([1-4])([1-3])|(EF)", name.upper())
    if not m:
        return None
    if m.group(1):
        return 8 * int(m.group(1))
    if m.group(2):
        return 8 * int(m.group(2)) + 2 * int(m.group(3))
    return 46


def dcb_app_dscp(text: str) -> dict[int, int]:
    """``dcb [-N] app show dev IF dscp-prio``: {dscp: priority}; with the same DSCP listed
    twice (dcb-app(8): conflicting entries are valid) the last one wins, as the driver's
    table lookup does not promise either."""
    m = re.search(r"\bdscp-prio((?:\s+[A-Za-z0-9]{1,4}:\d)+)", _output(text))
    out: dict[int, int] = {}
    if m:
        for item in m.group(1).split():
            name, prio = item.split(":")
            dscp = dscp_value(name)
            if dscp is not None and int(prio) < PRIORITIES:
                out[dscp] = int(prio)
    return out


def traffic_class(text: str | None) -> int | None:
    """MLNX_OFED ``tc/PORT/traffic_class``: ``Global tclass=106``; empty when unset."""
    m = re.search(r"Global tclass=(\d{1,3})\b", text or "")
    return int(m.group(1)) if m and int(m.group(1)) < 256 else None


def tos_priority(tos: int, dscp2prio: dict[int, int] | None = None) -> tuple[int, int]:
    """(DSCP, priority) of a ToS byte: DSCP is its top six bits (RFC 2474); the priority
    comes from the port's DSCP map, by default DSCP >> 3 (mlx5 firmware default, as
    mlnx_qos --trust dscp writes it: Mellanox/mlnx-tools python/Python/dcbnetlink.py)."""
    dscp = (tos >> 2) & 0x3F
    return dscp, (dscp2prio or {}).get(dscp, dscp >> 3)
