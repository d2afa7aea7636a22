"""The switch side of lossless RoCE: PFC, the DSCP map and ECN read from switch outputs, and
checked against the hosts' plan (the priority with PFC and the DSCP RoCE is marked with).

A lossless fabric needs every hop to agree with the NICs: the switch must map the host's
DSCP to the same priority, pause that priority (PFC) and mark ECN on the queue it uses.
One table row per format, each a parser of the text an operator saves from the switch
(recorded real outputs and their sources: tests/fixtures/switch/SOURCES.md):

- ``sonic``: CONFIG_DB as JSON (``show runningconfiguration all``, /etc/sonic/config_db.json,
  what ``sonic-cfggen`` writes): PORT_QOS_MAP pfc_enable and dscp_to_tc_map per port,
  DSCP_TO_TC_MAP, MAP_PFC_PRIORITY_TO_QUEUE, and QUEUE|port|q wred_profile whose WRED_PROFILE
  ecn is not ecn_none (sonic-buildimage sonic-yang-models); or ``show pfc priority``
  (PFC only).
- ``cumulus``: NVUE ``nv show interface IF qos roce status`` or ``nv show qos roce``:
  pfc-priority, congestion-control congestion-mode and enabled-tc, trust-mode, the
  PCP/DSCP->SP and SP->TC tables (Cumulus Linux RoCE docs).
- ``onyx``: ``show roce`` (NVIDIA Onyx RoCE commands): trust, ``switch-priority N: enabled``,
  congestion-control mode and the RoCE TC table. It prints no DSCP map.
- ``eos``: Arista EOS ``show running-config`` (the QoS parts): ``qos map dscp ... to
  traffic-class N``, ``qos map traffic-class ... to tx-queue N``, per interface or ``qos
  profile`` (``service-profile``) ``priority-flow-control priority N no-drop``, ``qos trust``
  and ``tx-queue N`` / ``uc-tx-queue N`` with ``random-detect ecn minimum-threshold ...``;
  and ``show priority-flow-control`` (``Global PFC``, per port ``E``/``D`` and the
  priorities), whose status wins over the configured PFC when a file holds both.

Switch traffic classes are taken as the PFC priorities of the same number (SONiC's
tc_to_pg and pfc_to_queue maps, Cumulus switch priorities, EOS traffic classes all default
to it); an explicit priority-to-queue map in the output is followed. What an output does not
show is listed as not seen, never guessed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurmfabric.errors import UsageError

PRIORITIES = range(8)


@dataclass
class SwitchPort:
    switch: str
    port: str
    fmt: str
    pfc: frozenset[int] | None = None  # priorities with PFC (no-drop)
    dscp_to: dict[int, int] | None = None  # DSCP -> traffic class / switch priority
    map_noun: str = "TC"
    queue_of: dict[int, int] = field(default_factory=dict)  # priority -> queue/TC of ECN
    ecn: frozenset[int] | None = None  # queues / TCs that mark ECN
    trust: str | None = None  # the trust setting as printed
    trust_dscp: bool | None = None
    unseen: list[str] = field(default_factory=list)

    def label(self) -> str:
        return f"switch {self.switch} {self.port}"


@dataclass
class Plan:
    """What the hosts do: RoCE marked with ``dscp`` and carried on PFC ``priority``."""

    priority: int
    dscp: int
    source: str


class _Bad(Exception):
    """Bad input at a line; ``line`` may be a function that finds it (JSON is searched
    only when there is an error, so a large file stays one pass)."""

    def __init__(self, line: int | Callable[[], int], message: str) -> None:
        super().__init__(message)
        self.line, self.message = line() if callable(line) else line, message



def _ints(text: str, top: int, line: int | Callable[[], int], what: str) -> set[int]:
    """``3,4`` / ``3 4`` / ``3-4`` / ``''`` -> {3, 4}; anything else is bad input."""
    out: set[int] = set()
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        low, _, high = item.partition("-")
        if not (item.isascii() and low.isdigit() and (not high or high.isdigit())) \
                or int(high or low) > top:
            raise _Bad(line, f"{what} {text.strip()!r}: expected numbers 0-{top}")
        out.update(range(int(low), int(high or low) + 1))
    return out


def _prio(text: str, line: int | Callable[[], int], what: str, top: int = 7) -> int:
    """One number 0..top (a priority, TC or queue; a DSCP with top 63)."""
    if not (text.isascii() and text.isdigit() and int(text) <= top):
        raise _Bad(line, f"{what} {text!r}: expected a number 0-{top}")
    return int(text)


def _line_of(text: str, needle: str) -> int:
    at = text.find(needle)
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


# --- SONiC -----------------------------------------------------------------------------------

def _sonic(text: str, switch: str) -> list[SwitchPort]:
    if "Lossless priorities" in text and not text.lstrip().startswith("{"):
        return _sonic_pfc_priority(text, switch)
    try:
        db = json.loads(text)
    except RecursionError:
        raise _Bad(1, "JSON nested too deeply") from None
    except ValueError as exc:
        raise _Bad(getattr(exc, "lineno", 1), f"not valid JSON ({exc})") from None
    if not isinstance(db, dict) or not isinstance(db.get("PORT_QOS_MAP"), dict):
        raise _Bad(1, "CONFIG_DB JSON without a PORT_QOS_MAP table")

    def at(needle: str) -> Callable[[], int]:
        return lambda: _line_of(text, f'"{needle}"')

    def table(name: str) -> dict:
        value = db.get(name) or {}
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise _Bad(at(name), f"{name} is not a table of objects")
        return value

    maps: dict[tuple[str, str], dict[int, int]] = {}

    def int_map(name: str, key: str, top: int) -> dict[int, int]:
        """A map table's entry: {"26": "3", ...} -> {26: 3}; keys 0..top, values 0..7."""
        if (name, key) not in maps:
            entries = table(name).get(key)
            if entries is None:
                raise _Bad(at(key), f"{name} {key!r} is not defined")
            maps[name, key] = {
                _prio(k, at(k), f"{name} {key} key", top):
                _prio(str(v), at(k), f"{name} {key}") for k, v in entries.items()}
        return maps[name, key]

    ecn_profiles = {n for n, p in table("WRED_PROFILE").items()
                    if str(p.get("ecn", "ecn_none")) != "ecn_none"}
    ecn: dict[str, set[int]] = {}
    for key, entry in table("QUEUE").items():
        parts = key.split("|")  # PORT|Q, or HOST|ASIC|PORT|Q on a chassis
        if len(parts) >= 2 and str(entry.get("wred_profile")) in ecn_profiles:
            ecn.setdefault(parts[-2], set()).update(_ints(parts[-1], 7, at(key), "QUEUE"))
    qos = table("PORT_QOS_MAP")
    default_map = qos.get("global", {}).get("dscp_to_tc_map")
    ports = []
    for name, entry in qos.items():
        if name == "global":
            continue
        line = at(name)
        port = SwitchPort(switch, name, "sonic", trust_dscp=True)
        port.pfc = frozenset(_ints(str(entry.get("pfc_enable", "")), 7, line, "pfc_enable"))
        for key in ("dscp_to_tc_map", "pfc_to_queue_map"):
            if not isinstance(entry.get(key, ""), str):
                raise _Bad(line, f"PORT_QOS_MAP {name} {key}: not a map name")
        map_name = entry.get("dscp_to_tc_map", default_map)
        if map_name:
            port.dscp_to = int_map("DSCP_TO_TC_MAP", str(map_name), 63)
        else:
            port.trust_dscp, port.trust = False, "no dscp_to_tc_map bound"
        if entry.get("pfc_to_queue_map"):
            port.queue_of = int_map("MAP_PFC_PRIORITY_TO_QUEUE", entry["pfc_to_queue_map"], 7)
        port.ecn = frozenset(ecn.get(name, ()))
        ports.append(port)
    return ports


def _sonic_pfc_priority(text: str, switch: str) -> list[SwitchPort]:
    """``show pfc priority``: ``Interface  Lossless priorities`` then ``Ethernet0  3,4``."""
    ports = []
    for number, raw in enumerate(text.splitlines(), 1):
        parts = raw.split()
        if len(parts) in (1, 2) and re.fullmatch(r"Ethernet\d+", parts[0]):
            port = SwitchPort(switch, parts[0], "sonic")
            port.pfc = frozenset(_ints(parts[1] if len(parts) == 2 else "", 7, number,
                                       "lossless priorities"))
            port.unseen.append("DSCP map: 'show pfc priority' shows PFC only ('show "
                               "runningconfiguration all' has the maps and queues)")
            ports.append(port)
    return ports


# --- Cumulus Linux (NVUE) ---------------------------------------------------------------------

def _cumulus(text: str, switch: str) -> list[SwitchPort]:
    m = re.search(r"nv show interface (\S+) qos roce", text)
    port = SwitchPort(switch, m.group(1) if m else "(all ports)", "cumulus",
                      map_noun="switch priority")
    dscp_to: dict[int, int] = {}
    mode = table = None
    for number, raw in enumerate(text.splitlines(), 1):
        cols = re.split(r"\s{2,}", raw.strip())
        if raw.startswith("RoCE "):
            table = "dscp" if "DSCP->SP" in raw else "tc" if "SP->TC" in raw else None
            continue
        if table and len(cols) >= 4 and cols[-1].strip("-=") and cols[1].isdigit():
            if table == "dscp":
                sp = _prio(cols[3], number, "switch-prio")
                dscp_to.update((d, sp) for d in _ints(cols[2], 63, number, "dscp"))
            else:
                port.queue_of[_prio(cols[1], number, "switch-prio")] = _prio(
                    cols[2], number, "traffic-class")
            continue
        if len(cols) < 2:
            continue
        if cols[0] == "pfc-priority":
            port.pfc = frozenset(_ints(cols[1], 7, number, "pfc-priority"))
        elif cols[0] == "congestion-mode":
            mode = cols[1]
        elif cols[0] == "enabled-tc":
            port.ecn = frozenset(_ints(cols[1], 7, number, "enabled-tc"))
        elif cols[0] == "trust-mode":
            port.trust, port.trust_dscp = cols[1], "dscp" in cols[1]
    if port.ecn is not None and mode is not None and "ecn" not in mode.lower():
        port.ecn = frozenset()  # congestion control without ECN marking
    if port.pfc is None and port.ecn is None and not dscp_to:
        raise _Bad(1, "no pfc-priority, congestion-control or DSCP table: not an 'nv show "
                   "... qos roce' output")
    port.dscp_to = dscp_to or None
    if not dscp_to:
        port.unseen.append("DSCP map: no 'RoCE PCP/DSCP->SP mapping' table in the output")
    return [port]


# --- NVIDIA Onyx ------------------------------------------------------------------------------

def _onyx(text: str, switch: str) -> list[SwitchPort]:
    port = SwitchPort(switch, "(all ports)", "onyx", map_noun="switch priority")
    pfc_on, mode, roce_tcs = None, None, set()
    pfc: set[int] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if m := re.match(r"Port trust mode\s*:\s*(\S+)", line):
            port.trust, port.trust_dscp = m.group(1), m.group(1).upper() in ("L3", "BOTH")
        elif m := re.match(r"PFC\s*:\s*(\S+)", line):
            pfc_on = m.group(1).lower() == "enabled"
        elif m := re.match(r"switch-priority\s+(\S+)\s*:\s*(\S+)", line):
            if m.group(2).lower() == "enabled":
                pfc.add(_prio(m.group(1), number, "switch-priority"))
        elif m := re.match(r"Mode\s*:\s*(.+)", line):
            mode = m.group(1)
        elif m := re.match(r"(\d+)\s+(\d+)\s+(\S+)\s", line):
            sp = _prio(m.group(1), number, "Switch-Priority")
            port.queue_of[sp] = _prio(m.group(2), number, "TC")
            if m.group(3).lower() == "roce":
                roce_tcs.add(port.queue_of[sp])
    if pfc_on is None and mode is None:
        raise _Bad(1, "no 'PFC :' and no congestion-control 'Mode:' line: not a 'show roce' "
                   "output")
    port.pfc = frozenset(pfc if pfc_on else ())
    if mode is not None:  # the congestion control of RoCE mode applies to the RoCE TC
        port.ecn = frozenset(roce_tcs if "ecn" in mode.lower() else ())
    port.unseen.append("DSCP map: 'show roce' prints the trust mode, not the DSCP to "
                       "switch-priority map ('show qos interface ethernet 1/1' does)")
    return [port]


# --- Arista EOS -------------------------------------------------------------------------------

@dataclass
class _EosBlock:
    pfc: set[int] = field(default_factory=set)
    ecn: set[int] = field(default_factory=set)
    trust: str | None = None
    profile: str | None = None
    policy: str | None = None


_EOS_PFC_ROW = re.compile(r"(Et(?:hernet)?)(\d\S*)\s+([ED]) [A-] [W-]\s*(.*)")


def _eos(text: str, switch: str) -> list[SwitchPort]:
    dscp_to: dict[int, int] = {}
    tc_queue: dict[int, int] = {}
    blocks: dict[str, _EosBlock] = {}
    status: dict[str, frozenset[int]] = {}  # 'show priority-flow-control': port -> on
    block = queue = legend = None
    global_on = True
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if m := re.fullmatch(r"Global PFC : (\S+)", line):
            global_on = m.group(1) == "Enabled"
        elif line.startswith("E: PFC Enabled, D: PFC Disabled"):
            legend = True
        elif legend and (m := _EOS_PFC_ROW.fullmatch(line)):
            words = m.group(4).split()  # Priorities, then Action ... ('-' when none)
            prios = words[0] if words and re.fullmatch(r"[\d,]+", words[0]) else ""
            status[f"Ethernet{m.group(2)}"] = frozenset(
                _ints(prios, 7, number, "Priorities") if m.group(3) == "E" and global_on
                else ())
            continue
        if len(raw) - len(raw.lstrip()) <= 3:
            queue = None  # a tx-queue's settings are indented under it
        if not raw.startswith(" "):
            block = None
            if m := re.fullmatch(r"(interface \S+|qos profile \S+)", line):
                block = blocks.setdefault(m.group(1), _EosBlock())
            elif m := re.fullmatch(r"qos map dscp ([\d\s]+) to traffic-class (\d+)"
                                   r"(?: drop-precedence \d)?", line):
                tc = _prio(m.group(2), number, "traffic-class")
                dscp_to.update((d, tc) for d in _ints(m.group(1), 63, number, "dscp"))
            elif m := re.fullmatch(r"qos map traffic-class ([\d\s]+) to tx-queue (\d+)", line):
                tc_queue.update((t, _prio(m.group(2), number, "tx-queue"))
                                for t in _ints(m.group(1), 7, number, "traffic-class"))
            continue
        if block is None:
            continue
        if m := re.fullmatch(r"(?:uc-)?tx-queue (\S+)", line):
            queue = _prio(m.group(1), number, "tx-queue")
        elif line.startswith("random-detect ecn minimum-threshold") and queue is not None:
            block.ecn.add(queue)
        elif m := re.fullmatch(r"priority-flow-control priority (\S+) (no-drop|drop)", line):
            prio = _prio(m.group(1), number, "priority-flow-control priority")
            (block.pfc.add if m.group(2) == "no-drop" else block.pfc.discard)(prio)
        elif m := re.fullmatch(r"(no )?qos trust ?(\S*)", line):
            block.trust = "none" if m.group(1) else m.group(2)
        elif m := re.fullmatch(r"service-profile (\S+)", line):
            block.profile = m.group(1)
        elif m := re.fullmatch(r"service-policy type qos input (\S+)", line):
            block.policy = m.group(1)
    ports = []
    configured = {name.split()[1]: own for name, own in blocks.items()
                  if name.startswith("interface ") and own != _EosBlock()}
    for name in sorted(set(configured) | set(status), key=_port_order):
        own = configured.get(name, _EosBlock())
        prof = blocks.get(f"qos profile {own.profile}", _EosBlock())
        port = SwitchPort(switch, name, "eos", dscp_to=dscp_to or None)
        port.pfc = status.get(name, frozenset(own.pfc | prof.pfc))  # the status wins
        port.ecn = frozenset(own.ecn | prof.ecn) if name in configured else None
        port.queue_of = {p: tc_queue.get(p, p) for p in PRIORITIES}
        if not dscp_to:
            port.unseen.append("DSCP map: no 'qos map dscp' line (save the running-config)")
        port.trust = own.trust or prof.trust
        port.trust_dscp = None if port.trust is None else port.trust == "dscp"
        if own.policy or prof.policy:
            port.unseen.append(f"classification: service-policy {own.policy or prof.policy} "
                               "may set the traffic class before the DSCP map (not evaluated)")
        ports.append(port)
    if not ports:
        raise _Bad(1, "no interface with QoS settings and no 'show priority-flow-control' "
                   "table: not an EOS output")
    return ports


def _port_order(name: str) -> list:
    """Ethernet2 before Ethernet10 (the switch's own order)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


# --- formats, reading, checking ---------------------------------------------------------------

FORMATS: dict[str, tuple[Callable[[str, str], list[SwitchPort]], str]] = {
    "sonic": (_sonic, r'^\s*\{|Lossless priorities'),
    "cumulus": (_cumulus, r"nv show .*qos roce|^\s*pfc-priority\s|RoCE PCP/DSCP->SP"),
    "onyx": (_onyx, r"^RoCE mode\s*:"),
    "eos": (_eos, r"^qos map dscp |^interface Ethernet|^E: PFC Enabled, D: PFC Disabled"),
}


def split_spec(spec: str) -> tuple[str | None, str]:
    """``[FORMAT:]FILE`` -> (format or None, path); a path may itself hold a colon."""
    fmt, sep, path = spec.partition(":")
    return (fmt, path) if sep and fmt in FORMATS else (None, spec)


def read(spec: str) -> list[SwitchPort]:
    """Parse one ``[FORMAT:]FILE``; the switch is named after the file (leaf1.txt: leaf1).
    Unknown or unparseable input is a UsageError naming the file and the line."""
    from slurmfabric._common.inputfile import read_text

    fmt, path = split_spec(spec)
    text = read_text(path, "switch output")
    if fmt is None:
        fmt = next((f for f, (_, sig) in FORMATS.items() if re.search(sig, text, re.M)), None)
    if fmt is None:
        raise UsageError(f"{path}:1: not a switch output this reads (SONiC config_db JSON or "
                         "'show pfc priority', Cumulus 'nv show ... qos roce', Onyx 'show "
                         "roce', EOS running-config)", hint="name the format: --switch "
                         f"{'|'.join(FORMATS)}:FILE")
    try:
        ports = FORMATS[fmt][0](text, Path(path).stem)
    except _Bad as bad:
        raise UsageError(f"{path}:{bad.line}: {fmt}: {bad.message}",
                         hint=f"pass the saved output of a {fmt} switch") from None
    if not ports:
        raise UsageError(f"{path}:1: {fmt}: no port found in the output")
    return ports


def _prios(values: frozenset[int]) -> str:
    if not values:
        return "no priority"
    return ("priority " if len(values) == 1 else "priorities ") + ", ".join(
        str(v) for v in sorted(values))


def check(port: SwitchPort, plan: Plan) -> tuple[list[str], list[str]]:
    """(findings, not seen) of one switch port against the hosts' plan."""
    found, unseen = [], list(port.unseen)
    p, d = plan.priority, plan.dscp
    if port.pfc is None:
        unseen.append("PFC: not in the output")
    elif p not in port.pfc:
        found.append(f"PFC on {_prios(port.pfc)}, host plan uses priority {p}")
    if port.trust_dscp is False:
        found.append(f"trust {port.trust}: the switch does not classify by DSCP, host marks "
                     f"DSCP {d} for priority {p}")
    if port.dscp_to is not None:
        mapped = port.dscp_to.get(d)
        if mapped is None:
            unseen.append(f"DSCP {d}: not in the switch's DSCP map (the platform default "
                          "applies)")
        elif mapped != p:
            found.append(f"DSCP {d} maps to {port.map_noun} {mapped} on the switch, host "
                         f"marks {d} for priority {p}")
    queue = port.queue_of.get(p, p)
    if port.ecn is None:
        unseen.append("ECN: not in the output")
    elif queue not in port.ecn:
        found.append(f"ECN off on the lossless queue {queue}")
    return [f"{port.label()}: {f}" for f in found], [f"{port.label()}: {u}" for u in unseen]


def plan_from_hosts(samples: dict) -> Plan | None:
    """The hosts' plan from an audit's samples: the PFC priority and the RoCE DSCP most
    ports use (a port's ToS gives its DSCP: the top six bits)."""
    from collections import Counter

    prios: Counter[int] = Counter()
    dscps: Counter[int] = Counter()
    for node_samples in samples.values():
        for rp in node_samples[0].ports if node_samples else ():
            on = [q for q, flag in enumerate(rp.pfc or ()) if flag]
            if len(on) == 1:
                prios[on[0]] += 1
            if rp.roce_tos is not None:
                dscps[rp.roce_tos >> 2] += 1
    if not prios or not dscps:
        return None
    (prio, n), (dscp, m) = prios.most_common(1)[0], dscps.most_common(1)[0]
    return Plan(prio, dscp, f"the hosts' samples: PFC priority on {n} ports, ToS DSCP on "
                            f"{m} ports")
