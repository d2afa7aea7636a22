"""Pure parsers for infiniband-diags output: ``iblinkinfo``, ``perfquery``, ``ibstat``,
``ibnetdiscover``.

Each takes the text a tool printed and returns frozen values; nothing here runs a tool, so
every parser is tested on recorded output (tests/fixtures/ib/). Lines a parser does not
recognise are skipped (the tools interleave ``ibwarn:`` lines on stderr and, under some
setups, on stdout), but a text that yields nothing where something was expected raises
:class:`~slurmfabric.errors.TopologyError` quoting the start of the raw output.

Formats follow infiniband-diags 44 (rdma-core): iblinkinfo's default and ``--line`` output,
``perfquery`` / ``perfquery -x`` "Name:....value" blocks, ``ibstat`` CA/Port blocks and the
ibnetdiscover topology file (the same format ibsim reads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slurmfabric.errors import TopologyError

# Nominal data rate per lane in Gb/s for the per-lane signalling rate iblinkinfo prints.
# SDR..QDR print the nominal figure; FDR and later print the signalling rate
# (14.0625 -> 14, 25.78125 -> 25, 53.125 -> 50, 106.25 -> 100, 212.5 -> 200), which is why
# ibstat says "Rate: 200" for a 4X 53.125 Gbps HDR port.
_LANE_RATE = {
    2.5: 2.5,
    5.0: 5.0,
    10.0: 10.0,
    14.0625: 14.0,
    25.78125: 25.0,
    53.125: 50.0,
    106.25: 100.0,
    212.5: 200.0,
}

# Ordered so that a degradation can be detected by comparing positions.


def lane_count(width: str) -> int:
    """``"4X"`` -> 4; 0 for anything unknown."""
    match = re.fullmatch(r"([0-9]{1,3})X", width.strip().upper())
    return int(match.group(1)) if match else 0


def lane_rate(speed: str) -> float:
    """Nominal Gb/s per lane for an iblinkinfo speed such as ``"53.125 Gbps"``."""
    match = re.match(r"\s*([\d.]+)\s*Gbps", speed)
    if not match:
        return 0.0
    signalling = float(match.group(1))
    return _LANE_RATE.get(signalling, signalling)


def link_rate(width: str, speed: str) -> float:
    """Nominal link rate in Gb/s (``"4X"``, ``"53.125 Gbps"`` -> 200.0)."""
    return lane_count(width) * lane_rate(speed)


@dataclass(frozen=True)
class PortLink:
    """One port line of iblinkinfo: the local port and, when it is up, its peer."""

    node_type: str  # "CA" or "Switch"
    guid: str  # node GUID for a switch, port GUID for a CA (as iblinkinfo prints it)
    desc: str  # node description, e.g. "sfn01 HCA-1" or "MF0;leaf1:MQM8700/U1"
    lid: int
    port: int
    width: str  # "4X"; "" when the port is down
    speed: str  # "53.125 Gbps" or "10.0 Gbps (FDR10)"; "" when down
    state: str  # Active, Initialize, Armed, Down
    phys: str  # LinkUp, Polling, Disabled, ...
    remote_guid: str = ""  # only in --line output
    remote_lid: int = 0
    remote_port: int = 0
    remote_desc: str = ""
    could_be_width: str = ""
    could_be_speed: str = ""

    @property
    def up(self) -> bool:
        return self.phys == "LinkUp" and self.remote_port > 0

    @property
    def rate(self) -> float:
        return link_rate(self.width, self.speed) if self.width else 0.0

    @property
    def key(self) -> str:
        return f"{self.guid}:{self.port}"

    @property
    def remote_key(self) -> str:
        return f"{self.remote_guid}:{self.remote_port}" if self.remote_guid else ""


# "    0x0002c903000e0b72      5    1[  ] ==( 4X 25.78125 Gbps Active/  LinkUp)==> ..."
# The part inside "==( ... )==>" is "<width> <speed> <state>/ <phys>" or "<state>/ <phys>".
_LINK_BODY = re.compile(
    r"==\(\s*(?:(?P<width>[0-9]{1,3}X)\s+(?P<speed>[\d.]+\s*Gbps(?:\s*\([^)]*\))?)\s+)?"
    r"(?P<state>[A-Za-z]+)/\s*(?P<phys>[A-Za-z]+)\s*\)==>"
)
_REMOTE = re.compile(
    r"==>\s*(?:(?P<rguid>0x[0-9a-fA-F]+)\s+)?(?:(?P<rlid>[0-9]{1,9})\s+)?(?P<rport>[0-9]{1,9})?\s*"
    r"\[[^\]]*\]\s*\"(?P<rdesc>[^\"]*)\"\s*\((?P<hint>[^)]*)\)"
)
_LOCAL_LINE = re.compile(
    r"^\s*(?:(?P<guid>0x[0-9a-fA-F]+)\s+)?(?:\"(?P<desc>[^\"]*)\"\s+)?"
    r"(?P<lid>[0-9]{1,9})\s+(?P<port>[0-9]{1,9})\s*\[[^\]]*\]\s*==\("
)
# Matched against right-stripped lines; the description is stripped after the match. No
# "\s*" next to ".*": that pair backtracks quadratically on a long line without the colon.
_CA_HEADER = re.compile(r"^CA:(?P<desc>.*):$")
_SW_HEADER = re.compile(r"^Switch:\s*(?P<guid>0x[0-9a-fA-F]+)\s(?P<desc>.*):$")
_COULD_BE_WIDTH = re.compile(r"Could be (\d+X)")
_COULD_BE_SPEED = re.compile(r"Could be ([\d.]+\s*Gbps(?:\s*\(\w+\))?|FDR10)")


def parse_iblinkinfo(text: str) -> list[PortLink]:
    """Parse ``iblinkinfo`` (default or ``--line``) output into one entry per port line.

    The default format names the node in a ``CA: desc:`` / ``Switch: guid desc:`` header
    and gives the CA port GUID at the start of each CA port line; ``--line`` repeats GUID
    and description on every line and adds the peer's GUID, which the audit needs to pair
    both ends of a link. The type of a ``--line`` entry is not printed: a line whose LID is
    shared by several ports is a switch, otherwise a CA (switch ports share the switch LID).
    """
    ports: list[PortLink] = []
    node_type, node_guid, node_desc = "", "", ""
    for raw in text.splitlines():
        line = raw.rstrip()
        header = _CA_HEADER.match(line)
        if header:
            node_type, node_guid, node_desc = "CA", "", header.group("desc").strip()
            continue
        header = _SW_HEADER.match(line)
        if header:
            node_type = "Switch"
            node_guid, node_desc = header.group("guid").lower(), header.group("desc").strip()
            continue
        local = _LOCAL_LINE.match(line)
        body = _LINK_BODY.search(line)
        if not local or not body:
            continue
        remote = _REMOTE.search(line)
        hint = remote.group("hint") if remote else ""
        guid = (local.group("guid") or node_guid).lower()
        desc = local.group("desc")
        ports.append(
            PortLink(
                node_type=node_type if desc is None else "",
                guid=guid,
                desc=(desc if desc is not None else node_desc).strip(),
                lid=int(local.group("lid")),
                port=int(local.group("port")),
                width=(body.group("width") or "").upper(),
                speed=" ".join((body.group("speed") or "").split()),
                state=body.group("state"),
                phys=body.group("phys"),
                remote_guid=((remote.group("rguid") or "").lower() if remote else ""),
                remote_lid=int(remote.group("rlid") or 0) if remote else 0,
                remote_port=int(remote.group("rport") or 0) if remote else 0,
                remote_desc=(remote.group("rdesc") if remote else "").strip(),
                could_be_width=_first(_COULD_BE_WIDTH, hint),
                could_be_speed=_first(_COULD_BE_SPEED, hint),
            )
        )
    if not ports and text.strip():
        raise TopologyError(
            f"no port lines in iblinkinfo output: {_head(text)!r}",
            hint="run iblinkinfo by hand; is a subnet manager running and the HCA up?",
        )
    return _infer_line_mode_types(ports)


def _infer_line_mode_types(ports: list[PortLink]) -> list[PortLink]:
    if all(p.node_type for p in ports):
        return ports
    ports_per_guid: dict[str, int] = {}
    for p in ports:
        ports_per_guid[p.guid] = ports_per_guid.get(p.guid, 0) + 1
    out = []
    for p in ports:
        if p.node_type:
            out.append(p)
            continue
        # A switch prints every port (0 is not listed, 1..N are); a CA line is one port of
        # one GUID. Switch GUIDs repeat across lines; CA port GUIDs do not.
        kind = "Switch" if ports_per_guid[p.guid] > 1 else "CA"
        out.append(_replace(p, node_type=kind))
    return out


def _replace(p: PortLink, **changes: object) -> PortLink:
    from dataclasses import replace

    return replace(p, **changes)  # type: ignore[arg-type]


def _first(pattern: re.Pattern[str], text: str) -> str:
    match = pattern.search(text)
    return " ".join(match.group(1).split()) if match else ""


def _head(text: str, limit: int = 200) -> str:
    return text.strip()[:limit]


@dataclass(frozen=True)
class PortCounters:
    """One ``# Port counters: Lid L port P`` block of perfquery output."""

    lid: int
    port: int
    values: dict[str, int] = field(default_factory=dict)
    extended: bool = False


_PQ_HEADER = re.compile(
    r"^#\s*Port (?P<ext>extended )?counters:\s*Lid\s+(?P<lid>[0-9]{1,9})\s+"
    r"port\s+(?P<port>[0-9]{1,9})", re.I
)
_PQ_VALUE = re.compile(
    r"^(?P<name>[A-Za-z0-9_]+):\.*(?P<value>0x[0-9a-fA-F]{1,16}|[0-9]{1,20})\s*$"
)


def parse_perfquery(text: str) -> list[PortCounters]:
    """Parse ``perfquery`` or ``perfquery -x`` output (one or more blocks).

    ``-x`` prints PortCountersExtended; since rdma-core PR #695 it includes the error
    counters (SymbolErrorCounter, LinkDownedCounter, ...) only when the port advertises
    IsAdditionalPortCountersExtendedSupported, so callers merge it with plain ``perfquery``
    output when they are absent. Select fields (PortSelect, CounterSelect*) are dropped.
    """
    blocks: list[PortCounters] = []
    current: dict[str, int] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        header = _PQ_HEADER.match(line)
        if header:
            current = {}
            blocks.append(
                PortCounters(
                    int(header.group("lid")),
                    int(header.group("port")),
                    current,
                    extended=bool(header.group("ext")),
                )
            )
            continue
        value = _PQ_VALUE.match(line)
        if value is None or current is None:
            continue
        name = value.group("name")
        if name in ("PortSelect",) or name.startswith("CounterSelect"):
            continue
        current[name] = int(value.group("value"), 0)
    if not blocks and text.strip():
        raise TopologyError(f"no counter blocks in perfquery output: {_head(text)!r}")
    return blocks


def merge_counters(blocks: list[PortCounters]) -> dict[str, int]:
    """Merge the blocks for one port; 64-bit extended values win over 32-bit ones."""
    merged: dict[str, int] = {}
    for block in sorted(blocks, key=lambda b: b.extended):
        merged.update(block.values)
    return merged


@dataclass(frozen=True)
class LocalPort:
    """One ``Port N:`` block of ``ibstat``."""

    ca: str
    ca_type: str
    port: int
    state: str
    phys: str
    rate: float
    lid: int
    sm_lid: int
    port_guid: str
    link_layer: str
    node_guid: str


_IBSTAT_CA = re.compile(r"^CA '(?P<ca>[^']+)'\s*$")
_IBSTAT_PORT = re.compile(r"^Port (?P<port>[0-9]{1,9}):\s*$")
_IBSTAT_KV = re.compile(r"^(?P<key>[A-Za-z ]+):\s*(?P<value>.*)$")


def parse_ibstat(text: str) -> list[LocalPort]:
    """Parse ``ibstat`` output: one :class:`LocalPort` per port of every CA."""
    ports: list[LocalPort] = []
    ca, ca_fields, port_fields, port_no = "", {}, {}, 0

    def flush() -> None:
        if ca and port_no:
            ports.append(
                LocalPort(
                    ca=ca,
                    ca_type=ca_fields.get("CA type", ""),
                    port=port_no,
                    state=port_fields.get("State", ""),
                    phys=port_fields.get("Physical state", ""),
                    rate=_float(port_fields.get("Rate", "0")),
                    lid=_int(port_fields.get("Base lid", "0")),
                    sm_lid=_int(port_fields.get("SM lid", "0")),
                    port_guid=port_fields.get("Port GUID", "").lower(),
                    link_layer=port_fields.get("Link layer", ""),
                    node_guid=ca_fields.get("Node GUID", "").lower(),
                )
            )

    for raw in text.splitlines():
        line = raw.strip()
        match = _IBSTAT_CA.match(line)
        if match:
            flush()
            ca, ca_fields, port_fields, port_no = match.group("ca"), {}, {}, 0
            continue
        match = _IBSTAT_PORT.match(line)
        if match and ca:
            flush()
            port_fields, port_no = {}, int(match.group("port"))
            continue
        match = _IBSTAT_KV.match(line)
        if match and ca:
            (port_fields if port_no else ca_fields)[match.group("key").strip()] = match.group(
                "value"
            ).strip()
    flush()
    if not ports and text.strip():
        raise TopologyError(f"no CA ports in ibstat output: {_head(text)!r}")
    return ports


def _int(value: str) -> int:
    try:
        return int(value, 0)
    except ValueError:
        return 0


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class TopoLink:
    """One cabled port of an ibnetdiscover topology file (seen from ``node_id``)."""

    node_type: str  # "Switch" or "CA"
    node_id: str  # the quoted id: "S-0002c9..." / "H-0002c9..." (or any id in ibsim files)
    node_desc: str
    port: int
    guid: str  # switch GUID or CA port GUID as iblinkinfo prints it ("" if not printed)
    remote_id: str
    remote_port: int
    remote_guid: str
    remote_desc: str


_TOPO_NODE = re.compile(
    r"^(?P<type>Switch|Ca|Hca|Rt)\s+(?P<ports>[0-9]{1,9})\s+\"(?P<id>[^\"]+)\"\s*(?:#\s*\"(?P<desc>[^\"]*)\")?"
)
_TOPO_PORT = re.compile(
    r"^\[(?P<port>[0-9]{1,9})\](?:\((?P<pguid>[0-9a-fA-F]+)\))?\s+\"(?P<rid>[^\"]+)\"\[(?P<rport>[0-9]{1,9})\]"
    r"(?:\((?P<rpguid>[0-9a-fA-F]+)\))?(?:\s*#[^\"]*\"(?P<rdesc>[^\"]*)\")?"
)
_TOPO_GUID = re.compile(r"^(?:switchguid|caguid|hcaguid)=(?P<guid>0x[0-9a-fA-F]+)")


def parse_ibnetdiscover(text: str) -> list[TopoLink]:
    """Parse an ibnetdiscover topology (``ibnetdiscover > topo.out``) into cabled ports.

    GUIDs are normalised to what iblinkinfo prints: the switch GUID for switch ports, the
    port GUID for CA ports (from ``[1](guid)``; ``"H-<nodeguid>"`` ids alone do not carry
    it). ibsim's extension lines (``width=``, ``do ...``) and port options are ignored.
    """
    links: list[TopoLink] = []
    node_type, node_id, node_desc, switch_guid = "", "", "", ""
    pending_guid = ""
    for raw in text.splitlines():
        line = raw.strip()
        match = _TOPO_GUID.match(line)
        if match:
            pending_guid = match.group("guid").lower()
            continue
        match = _TOPO_NODE.match(line)
        if match:
            kind = match.group("type")
            node_type = "Switch" if kind == "Switch" else "CA"
            node_id, node_desc = match.group("id"), (match.group("desc") or match.group("id"))
            switch_guid = pending_guid if node_type == "Switch" else ""
            if node_type == "Switch" and not switch_guid and node_id.startswith("S-"):
                switch_guid = "0x" + node_id[2:].lower()
            pending_guid = ""
            continue
        match = _TOPO_PORT.match(line)
        if match and node_id:
            pguid = match.group("pguid")
            guid = switch_guid if node_type == "Switch" else (f"0x{pguid.lower()}" if pguid else "")
            rpguid = match.group("rpguid")
            rid = match.group("rid")
            if rpguid:
                rguid = f"0x{rpguid.lower()}"
            elif rid.startswith("S-"):
                rguid = "0x" + rid[2:].lower()
            else:
                rguid = ""
            links.append(
                TopoLink(
                    node_type=node_type,
                    node_id=node_id,
                    node_desc=node_desc,
                    port=int(match.group("port")),
                    guid=_pad_guid(guid),
                    remote_id=rid,
                    remote_port=int(match.group("rport")),
                    remote_guid=_pad_guid(rguid),
                    remote_desc=match.group("rdesc") or "",
                )
            )
    if not links and text.strip():
        raise TopologyError(f"no cabled ports in ibnetdiscover output: {_head(text)!r}")
    return links


def _pad_guid(guid: str) -> str:
    """``0x2c9...`` -> ``0x0002c9...``: iblinkinfo prints 16 hex digits."""
    if not guid:
        return ""
    return "0x" + guid[2:].lower().rjust(16, "0")
