"""From slow pairs to the cable: which cables the bad pairs' paths share and no good pair's.

The fabric comes from an ``ibnetdiscover`` topology (the audit's parser, its node names).
Between two nodes traffic takes a shortest path (OpenSM's default min-hop routing); with
several equal paths (a fat tree's spines) any of them. For each pair this module finds the
cables on *every* shortest path between its HCAs (the access cables, a single uplink) and
on *any* of them. On a rail-optimised fabric (each HCA of a node on its own leaf, each leaf
serving one rail index: NVIDIA's DGX SuperPOD reference architecture) rails are kept apart:
rail r of one node is paired with rail r of the other, as NCCL's rail-local traffic runs,
never with the nearest HCA of another rail. A cable is a candidate when it is on every
path of a bad pair and on no path of a good pair; candidates are ranked by how many bad
pairs they explain. Each comes
with the commands that read its counters (infiniband-diags: ``perfquery -x -G GUID PORT``
on both ends) and, for an access cable, ``ibstat`` on the node.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from slurmfabric.ibaudit.audit import Link, expected_from_topology
from slurmfabric.ibaudit.names import NodeNamer
from slurmfabric.ibaudit.parse import TopoLink
from slurmfabric.pairsweep.plan import Pair


@dataclass
class Fabric:
    """Devices (switch GUIDs, HCA port GUIDs) joined by cables."""

    cables: list[Link]
    adjacent: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # dev -> (dev, i)
    hcas: dict[str, list[str]] = field(default_factory=dict)  # Slurm node -> its HCA devices
    desc: dict[str, str] = field(default_factory=dict)  # HCA device -> its node description
    rails: int = 0  # > 1: rail-optimised with this many rails (see ``_rail_count``)

    @classmethod
    def from_topology(cls, topo: list[TopoLink], namer: NodeNamer) -> Fabric:
        links = sorted(expected_from_topology(topo, namer), key=lambda link: link.label)
        fabric = cls(links)
        for index, link in enumerate(links):
            a, b = link.a.key.split(":")[0], link.b.key.split(":")[0]
            fabric.adjacent.setdefault(a, []).append((b, index))
            fabric.adjacent.setdefault(b, []).append((a, index))
            if link.node and link.a.node_type == "CA":
                fabric.hcas.setdefault(link.node, []).append(a)
                fabric.desc[a] = link.a.desc
        for devices in fabric.hcas.values():  # rail order: mlx5_0 < mlx5_2 < mlx5_10
            devices.sort(key=lambda d: (_natural(fabric.desc.get(d, "")), d))
        fabric.rails = fabric._rail_count()
        return fabric

    def _rail_count(self) -> int:
        """Rails when the fabric is rail-optimised: every node has the same number (2+) of
        HCAs, each on a different leaf switch, and every leaf serves one rail index only;
        0 otherwise (one HCA per node, or HCAs of several rails on one leaf)."""
        counts = {len(devices) for devices in self.hcas.values()}
        if len(counts) != 1 or min(counts) < 2:
            return 0
        rail_of_leaf: dict[str, int] = {}
        for devices in self.hcas.values():
            leaves = [self.adjacent[d][0][0] for d in devices if self.adjacent.get(d)]
            if len(set(leaves)) != len(devices):
                return 0
            for rail, leaf in enumerate(leaves):
                if rail_of_leaf.setdefault(leaf, rail) != rail:
                    return 0
        return counts.pop()

    def _bfs(self, source: str) -> tuple[dict[str, int], dict[str, int]]:
        """Hop distance and number of shortest paths from ``source`` to every device."""
        dist, count = {source: 0}, {source: 1}
        queue = deque([source])
        while queue:
            here = queue.popleft()
            for there, _ in self.adjacent.get(here, ()):
                if there not in dist:
                    dist[there] = dist[here] + 1
                    count[there] = 0
                    queue.append(there)
                if dist[there] == dist[here] + 1:
                    count[there] += count[here]
        return dist, count

    def cables_between(self, x: str, y: str, cache: dict,
                       only: set[int] | None = None) -> tuple[set[int], set[int]]:
        """(cables on every shortest path, cables on some shortest path) between the HCAs
        of nodes ``x`` and ``y`` (each HCA of x to the nearest HCA of y, or on a
        rail-optimised fabric to y's HCA of the same rail); ``only`` limits the cables
        looked at (the candidates, when judging the good pairs)."""
        every: set[int] | None = None
        some: set[int] = set()
        for rail, source in enumerate(self.hcas.get(x, [])):
            if source not in cache:
                cache[source] = self._bfs(source)
            dist_s, count_s = cache[source]
            targets = [t for t in self.hcas.get(y, []) if t in dist_s]
            if self.rails and len(targets) == self.rails:
                targets = [self.hcas[y][rail]] if self.hcas[y][rail] in dist_s else []
            if not targets:
                continue
            target = min(targets, key=lambda t: (dist_s[t], t))
            if target not in cache:
                cache[target] = self._bfs(target)
            dist_t, count_t = cache[target]
            total, length = count_s[target], dist_s[target]
            mine = set()
            for index in (range(len(self.cables)) if only is None else sorted(only)):
                link = self.cables[index]
                u, v = link.a.key.split(":")[0], link.b.key.split(":")[0]
                for p, q in ((u, v), (v, u)):
                    if p in dist_s and q in dist_t and dist_s[p] + 1 + dist_t[q] == length:
                        some.add(index)
                        if count_s[p] * count_t[q] == total:
                            mine.add(index)
            every = mine if every is None else every | mine
        return every or set(), some


@dataclass(frozen=True)
class Cable:
    link: Link
    explains: tuple[Pair, ...]  # the bad pairs it is on every path of

    @property
    def access(self) -> str | None:
        """The Slurm node when this is a node's own cable (HCA to its leaf switch)."""
        return self.link.node if self.link.a.node_type == "CA" else None

    def commands(self) -> list[str]:
        out = []
        for end in (self.link.a, self.link.b):
            guid = end.key.split(":")[0]
            out.append(f"perfquery -x -G {guid} {end.port}")
        if self.access:
            out.append(f"ibstat (on {self.access})")
        return out

    def message(self) -> str:
        pairs = ", ".join(f"{a}+{b}" for a, b in self.explains[:4])
        more = f" and {len(self.explains) - 4} more" if len(self.explains) > 4 else ""
        return (f"cable {self.link.label} is on every path of {len(self.explains)} bad pair(s) "
                f"({pairs}{more}) and on no good pair's path; check: "
                + "; ".join(self.commands()))


def shared_cables(fabric: Fabric, bad: list[Pair], good: list[Pair]) -> list[Cable]:
    """Candidates, the cable explaining most bad pairs first (ties by label)."""
    cache: dict = {}
    explains: dict[int, list[Pair]] = {}
    for pair in bad:
        for index in fabric.cables_between(pair[0], pair[1], cache)[0]:
            explains.setdefault(index, []).append(pair)
    candidates = set(explains)
    for x, y in good:  # a cable a good pair can use is not the problem
        if not candidates:
            break
        candidates -= fabric.cables_between(x, y, cache, candidates)[1]
    explains = {i: pairs for i, pairs in explains.items() if i in candidates}
    ranked = sorted(explains.items(), key=lambda kv: (-len(kv[1]), fabric.cables[kv[0]].label))
    return [Cable(fabric.cables[i], tuple(sorted(pairs))) for i, pairs in ranked]


def distances(fabric: Fabric, nodes: list[str]) -> dict[str, dict[str, int]]:
    """Cables between each two nodes: 2 on one leaf switch, 4 through a spine, 6 through a
    core (min-hop, as OpenSM routes). First HCA to first HCA; on a rail-optimised fabric
    rail to same rail, the longest of the rails (a pair "on one leaf" is so on every rail)."""
    out: dict[str, dict[str, int]] = {}
    cache: dict = {}
    rails = range(fabric.rails or 1)
    firsts = {b: fabric.hcas[b] for b in nodes if fabric.hcas.get(b)}
    for a in nodes:
        hcas = fabric.hcas.get(a)
        if not hcas:
            continue
        for rail in rails:
            if hcas[rail] not in cache:
                cache[hcas[rail]] = fabric._bfs(hcas[rail])
        if len(rails) == 1:  # one comprehension per node: 1,000 nodes is a million pairs
            dist = cache[hcas[0]][0]
            out[a] = {b: dist[theirs[0]] for b, theirs in firsts.items()
                      if b != a and theirs[0] in dist}
            continue
        row = out[a] = {}
        for b, theirs in firsts.items():
            if b == a:
                continue
            hops = [cache[hcas[r]][0].get(theirs[r]) for r in rails]
            if None not in hops:
                row[b] = max(h for h in hops if h is not None)
    return out


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def topology_rounds(fabric: Fabric, nodes: list[str], hops: list[int]) -> list[list[Pair]]:
    """Rounds of pairs chosen by distance (Microsoft SuperBench's topology-aware pattern):
    for each distance, pairs at that many cables, each node at most once per round, until
    every node that has a partner at that distance is in a pair. A few rounds test every
    leaf, spine and core path class instead of all N-1 rounds of the round robin."""
    table = distances(fabric, nodes)
    rounds: list[list[Pair]] = []
    for hop in hops:
        waiting = [n for n in nodes if any(d == hop for d in table.get(n, {}).values())]
        done: set[frozenset] = set()
        while waiting:
            busy: set[str] = set()
            this: list[Pair] = []
            for a in waiting:
                if a in busy:
                    continue
                partner = next((b for b in nodes if b not in busy and b != a
                                and table[a].get(b) == hop
                                and frozenset((a, b)) not in done), None)
                if partner is None:
                    continue
                this.append((a, partner))
                busy.update((a, partner))
                done.add(frozenset((a, partner)))
            if not this:
                break
            rounds.append(this)
            paired = {n for p in done for n in p}
            waiting = [n for n in waiting if n not in paired]
    return rounds


def rounds_from_file(topology: str, node_map: str | None, nodes: list[str],
                     hops_text: str) -> list[list[Pair]]:
    """``pairs submit --pattern topology``: read the ibnetdiscover file, check that every
    node is in it and the distances (``--hops``, cables: 2 a leaf, 4 a spine, 6 a core) are
    sane, then ``topology_rounds``."""
    from slurmfabric._common.inputfile import read_text
    from slurmfabric.errors import UsageError
    from slurmfabric.ibaudit.names import load_namer
    from slurmfabric.ibaudit.parse import parse_ibnetdiscover

    try:
        hops = [int(h) for h in hops_text.split(",") if h.strip()]
    except ValueError:
        raise UsageError(f"--hops {hops_text!r}: give even cable counts like 2,4,6") from None
    if not hops or any(h < 2 or h > 64 for h in hops):
        raise UsageError(f"--hops {hops_text!r}: give cable counts from 2 to 64, like 2,4,6")
    fabric = Fabric.from_topology(parse_ibnetdiscover(read_text(topology,
                                                                 "ibnetdiscover topology")),
                                  load_namer(node_map, None))
    missing = [n for n in nodes if n not in fabric.hcas]
    if missing:
        raise UsageError(f"--topology {topology}: no HCA of {', '.join(missing[:5])}",
                         hint="HCA descriptions must start with the Slurm node name, or give "
                         "--node-map")
    rounds = topology_rounds(fabric, nodes, hops)
    if not rounds:
        raise UsageError(f"--hops {hops_text}: no two nodes are that far apart in the fabric")
    return rounds
