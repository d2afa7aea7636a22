"""The routes the subnet manager really programmed, against the fabric's shortest.

A fat tree's cabling can be perfect while the subnet manager sends some node pairs through
five switches instead of three, or piles every destination of a leaf onto one of its
up-links: a wrong routing engine, a root GUID file that names the wrong switches, a table
loaded from an old file, or routes computed while a cable was out. Shortest-path hop counts
from ``ibnetdiscover`` cannot see this; the switches' linear forwarding tables can.

Inputs:
- the links, from ``iblinkinfo --line`` (``parse.parse_iblinkinfo``): who is cabled to whom;
- each switch's unicast LFT, from ``ibroute <switch LID>`` (the format ``dump_lfts.sh``
  concatenates, infiniband-diags ibroute(8)): destination LID -> output port.

For every pair of HCAs (the GPU nodes), the route is walked hop by hop through the LFTs from
the source's switch to the destination LID, exactly as the packets go, and compared with the
fewest switches any path through the cabling needs (breadth-first search over the switch
graph). Findings:
- ``route-long``: the pair's route crosses more switches than the shortest path;
- ``route-broken``: no LFT entry, a loop, or a route that ends at the wrong port;
- ``uplink-unbalanced``: at one switch, the destinations that have several equal-cost
  next hops (ports whose neighbour is one switch nearer) are spread over them more than one
  destination away from an even split, naming the ports and their counts.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

from slurmfabric.ibaudit.names import NodeNamer, _norm
from slurmfabric.ibaudit.parse import PortLink

_LFT_HEADER = re.compile(r"^Unicast lids \[[^\]]*\] of switch Lid (\d+) guid (0x[0-9a-fA-F]+)"
                         r"(?: \((.*)\))?:\s*$")
_LFT_ROW = re.compile(r"^(0x[0-9a-fA-F]+)\s+(\d+)\s*:")


@dataclass
class Switch:
    guid: str
    lid: int
    desc: str
    lft: dict[int, int] = field(default_factory=dict)  # destination LID -> output port


def parse_ibroute(text: str) -> dict[str, Switch]:
    """``ibroute`` output for one or more switches -> {switch GUID: its LFT}."""
    switches: dict[str, Switch] = {}
    current: Switch | None = None
    for line in text.splitlines():
        head = _LFT_HEADER.match(line.strip())
        if head:
            guid = _norm(head.group(2))
            current = switches.setdefault(guid, Switch(guid, int(head.group(1)),
                                                       (head.group(3) or "").strip()))
            continue
        row = _LFT_ROW.match(line.strip())
        if row and current is not None:
            current.lft[int(row.group(1), 16)] = int(row.group(2))
    return switches


@dataclass(frozen=True)
class Hca:
    name: str  # the node name (NodeNamer)
    guid: str
    lid: int
    switch: str  # the GUID of the switch it is cabled to


@dataclass(frozen=True)
class Finding:
    kind: str  # route-long, route-broken, uplink-unbalanced
    where: str  # "sfn01 -> sfn05" or a switch's description
    detail: str
    path: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def line(self) -> str:
        return f"{self.kind:<18} {self.where}: {self.detail}"


@dataclass
class Fabric:
    switches: dict[str, Switch]
    hcas: list[Hca]
    peers: dict[tuple[str, int], tuple[str, int]]  # (guid, port) -> (guid, port)

    def name(self, guid: str) -> str:
        sw = self.switches.get(guid)
        return (sw.desc or guid) if sw else guid


def build(ports: list[PortLink], switches: dict[str, Switch], namer: NodeNamer) -> Fabric:
    """The cabling from iblinkinfo, the switches from their LFTs, the HCAs with names."""
    peers: dict[tuple[str, int], tuple[str, int]] = {}
    hcas: dict[str, Hca] = {}
    for p in ports:
        if not p.up or not p.remote_guid:
            continue
        here, there = _norm(p.guid), _norm(p.remote_guid)
        peers[(here, p.port)] = (there, p.remote_port)
        peers[(there, p.remote_port)] = (here, p.port)
        for guid, lid, desc, other in ((here, p.lid, p.desc, there),
                                       (there, p.remote_lid, p.remote_desc, here)):
            if guid in switches or other not in switches or guid in hcas:
                continue
            name = namer.name(guid, desc.strip(), "CA")
            if name:
                hcas[guid] = Hca(name, guid, lid, other)
    for sw in switches.values():  # iblinkinfo's desc is the padded one: keep ibroute's
        if not sw.desc:
            sw.desc = next((p.desc.strip() for p in ports if _norm(p.guid) == sw.guid), "")
    return Fabric(switches, sorted(hcas.values(), key=lambda h: (h.name, h.lid)), peers)


def _neighbours(fabric: Fabric) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {g: set() for g in fabric.switches}
    for (guid, _port), (peer, _pport) in fabric.peers.items():
        if guid in fabric.switches and peer in fabric.switches:
            out[guid].add(peer)
    return out


def distances(fabric: Fabric, start: str) -> dict[str, int]:
    """Switches on the shortest path from ``start`` to each switch, counting both ends."""
    graph = _neighbours(fabric)
    seen = {start: 1}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        for there in graph[here]:
            if there not in seen:
                seen[there] = seen[here] + 1
                queue.append(there)
    return seen


def walk(fabric: Fabric, src: Hca, dst: Hca) -> tuple[list[str], str]:
    """(switch GUIDs the route crosses, error or ''): the LFTs followed from src's switch."""
    path: list[str] = []
    here = src.switch
    while True:
        if here in path:
            return path, f"loop at {fabric.name(here)}"
        path.append(here)
        port = fabric.switches[here].lft.get(dst.lid)
        if port is None or port == 0:
            return path, f"{fabric.name(here)} has no route to LID {dst.lid}"
        nxt = fabric.peers.get((here, port))
        if nxt is None:
            return path, f"{fabric.name(here)} sends LID {dst.lid} out of port {port}, " \
                         "which is not cabled"
        if nxt[0] not in fabric.switches:
            if nxt[0] != dst.guid:
                return path, f"{fabric.name(here)} port {port} delivers LID {dst.lid} to " \
                             "another HCA"
            return path, ""
        here = nxt[0]


def check(fabric: Fabric, nodes: set[str] | None = None) -> list[Finding]:
    """Every pair's route against the shortest, and every switch's up-link balance."""
    hcas = [h for h in fabric.hcas if nodes is None or h.name in nodes]
    shortest = {sw: distances(fabric, sw) for sw in {h.switch for h in hcas}}
    findings: list[Finding] = []
    for src in hcas:
        for dst in hcas:
            if src.guid == dst.guid or src.switch not in fabric.switches:
                continue
            path, error = walk(fabric, src, dst)
            names = tuple(fabric.name(g) for g in path)
            where = f"{src.name} -> {dst.name}"
            if error:
                findings.append(Finding("route-broken", where, error, names))
                continue
            best = shortest[src.switch].get(dst.switch)
            if best is not None and len(path) > best:
                findings.append(Finding(
                    "route-long", where, f"{len(path)} switches ({' -> '.join(names)}); the "
                    f"cabling allows {best}", names))
    return findings + balance(fabric, hcas)


def balance(fabric: Fabric, hcas: list[Hca]) -> list[Finding]:
    """At each switch, destinations with several equal-cost next hops, by the port the LFT
    chose: a spread more than one destination from even is an unbalanced up-link set."""
    graph = _neighbours(fabric)
    to_switch = {h.switch: distances(fabric, h.switch) for h in hcas}
    findings = []
    for guid, sw in sorted(fabric.switches.items(), key=lambda kv: kv[1].desc):
        groups: dict[frozenset[int], Counter[int]] = {}
        for dst in hcas:
            if dst.switch == guid or guid not in to_switch[dst.switch]:
                continue
            mine = to_switch[dst.switch][guid]
            ports = frozenset(p for (g, p), (peer, _) in fabric.peers.items()
                              if g == guid and peer in graph
                              and to_switch[dst.switch].get(peer) == mine - 1)
            if len(ports) < 2:
                continue
            chosen = sw.lft.get(dst.lid)
            tally = groups.setdefault(ports, Counter({p: 0 for p in ports}))
            if chosen in ports:
                tally[chosen] += 1
        for ports, tally in groups.items():
            total = sum(tally.values())
            even = total / len(ports)
            if max(tally.values()) > even + 1 or min(tally.values()) < even - 1:
                spread = ", ".join(
                    f"port {p} ({fabric.name(fabric.peers[(guid, p)][0])}) {tally[p]}"
                    for p in sorted(ports))
                findings.append(Finding(
                    "uplink-unbalanced", sw.desc or guid,
                    f"{total} destinations over {len(ports)} equal-cost ports: {spread}"))
    return findings


def format_findings(findings: list[Finding], limit: int = 50) -> str:
    if not findings:
        return "routes: every pair takes a shortest path; up-links balanced"
    lines = [f.line() for f in findings[:limit]]
    if len(findings) > limit:
        lines.append(f"... and {len(findings) - limit} more (--json lists all)")
    kinds = Counter(f.kind for f in findings)
    lines.append("routes: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    return "\n".join(lines)
