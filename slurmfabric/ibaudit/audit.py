"""Fabric audit: turn parsed link tables and port counters into findings about nodes.

Pure functions over parsed values (no tool runs here), so every rule is tested on recorded
output. A finding names the Slurm node on the HCA end of the link when there is one; links
between switches carry no node and are never drained.

Rules, worst first:
- ``link-down`` (critical): a link present in the expected topology (an ibnetdiscover file)
  or in the saved baseline audit is gone. A lost HCA link takes the HCA out of the fabric,
  so only the other end (or the baseline) still knows which node it was.
- ``node-missing`` (critical): an expected node has no HCA in the fabric and no link-down
  finding already names it.
- ``link-degraded`` (error): iblinkinfo's "Could be" hint (active width or speed below what
  both ends support), or a rate below the configured expectation.
- ``link-not-active`` (error): LinkUp but not Active (no SM, or stuck in Init/Armed).
- ``port-errors`` (warning): error counters above thresholds on either end of a link; with a
  baseline the thresholds apply to the increase since then (a counter that went down was
  reset, so its current value is the increase).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from slurmfabric.ibaudit.names import NodeNamer
from slurmfabric.ibaudit.parse import PortLink, TopoLink, lane_count, link_rate

SEVERITIES = ("critical", "error", "warning")

# The defaults of infiniband-diags' ibqueryerrors (/etc/infiniband-diags/error_thresholds).
DEFAULT_THRESHOLDS: dict[str, int] = {
    "SymbolErrorCounter": 10,
    "LinkErrorRecoveryCounter": 10,
    "LinkDownedCounter": 10,
    "PortRcvErrors": 10,
    "PortRcvRemotePhysicalErrors": 100,
    "PortRcvSwitchRelayErrors": 100,
    "PortXmitDiscards": 100,
    "PortXmitConstraintErrors": 100,
    "PortRcvConstraintErrors": 100,
    "LocalLinkIntegrityErrors": 10,
    "ExcessiveBufferOverrunErrors": 10,
    "VL15Dropped": 100,
    "PortXmitWait": 1000,
}


@dataclass(frozen=True)
class End:
    """One end of a link."""

    key: str  # "<guid>:<port>"
    desc: str
    node_type: str
    lid: int
    port: int

    @property
    def label(self) -> str:
        return f"{self.desc}/{self.port}"


@dataclass(frozen=True)
class Link:
    """A cabled, physically up link seen from both ends (CA end first when there is one)."""

    a: End
    b: End
    width: str
    speed: str
    state: str
    could_be_width: str = ""
    could_be_speed: str = ""
    node: str | None = None

    @property
    def rate(self) -> float:
        return link_rate(self.width, self.speed)

    @property
    def label(self) -> str:
        return f"{self.a.label} <-> {self.b.label}"

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["rate_gbps"] = self.rate
        return data

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Link:
        fields = dict(data)
        fields.pop("rate_gbps", None)
        fields["a"] = End(**fields["a"])  # type: ignore[arg-type]
        fields["b"] = End(**fields["b"])  # type: ignore[arg-type]
        return cls(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Finding:
    severity: str
    check: str
    node: str | None
    where: str
    detail: str
    values: dict[str, object] = field(default_factory=dict)

    @property
    def sort_key(self) -> tuple[int, str, str, str]:
        return (SEVERITIES.index(self.severity), self.node or "~", self.check, self.where)


def build_links(ports: Iterable[PortLink], namer: NodeNamer) -> list[Link]:
    """Pair the two port lines of every up link (from ``iblinkinfo --line``)."""
    ports = list(ports)
    by_key = {p.key: p for p in ports}
    links: dict[frozenset[str], Link] = {}
    for p in ports:
        if not p.up or not p.remote_guid:
            continue
        pair = frozenset((p.key, p.remote_key))
        peer = by_key.get(p.remote_key)
        here = End(p.key, p.desc, p.node_type, p.lid, p.port)
        there = End(
            p.remote_key,
            peer.desc if peer else p.remote_desc,
            peer.node_type if peer else ("CA" if p.node_type == "Switch" else "Switch"),
            p.remote_lid,
            p.remote_port,
        )
        a, b = _orient(here, there)
        old = links.get(pair)
        state = p.state if old is None or p.state != "Active" else old.state
        links[pair] = Link(
            a=a,
            b=b,
            width=p.width,
            speed=p.speed,
            state=state,
            could_be_width=p.could_be_width or (old.could_be_width if old else ""),
            could_be_speed=p.could_be_speed or (old.could_be_speed if old else ""),
            node=namer.name(a.key.split(":")[0], a.desc, a.node_type),
        )
    return sorted(links.values(), key=lambda link: (link.node or "~", link.label))


def _orient(x: End, y: End) -> tuple[End, End]:
    if x.node_type == "CA" and y.node_type != "CA":
        return x, y
    if y.node_type == "CA" and x.node_type != "CA":
        return y, x
    return (x, y) if x.key <= y.key else (y, x)


def expected_from_topology(topo: Iterable[TopoLink], namer: NodeNamer) -> list[Link]:
    """Links of an ibnetdiscover topology file, as :class:`Link` values without rates."""
    out: dict[frozenset[str], Link] = {}
    for t in topo:
        if not t.guid or not t.remote_guid:
            continue
        here = End(f"{t.guid}:{t.port}", t.node_desc, t.node_type, 0, t.port)
        remote_type = "Switch" if t.remote_id.startswith("S-") else "CA"
        there = End(
            f"{t.remote_guid}:{t.remote_port}", t.remote_desc, remote_type, 0, t.remote_port
        )
        a, b = _orient(here, there)
        pair = frozenset((a.key, b.key))
        if pair not in out:
            node = namer.name(a.key.split(":")[0], a.desc, a.node_type)
            out[pair] = Link(a, b, "", "", "", node=node)
    return list(out.values())


def audit(
    links: list[Link],
    counters: dict[str, dict[str, int]],
    *,
    expected: Iterable[Link] = (),
    expect_nodes: Iterable[str] = (),
    baseline_counters: dict[str, dict[str, int]] | None = None,
    thresholds: dict[str, int] | None = None,
    expect_width: str | None = None,
    expect_rate: float | None = None,
) -> list[Finding]:
    """All findings, sorted worst first (then by node)."""
    thresholds = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    findings: list[Finding] = []
    present = {frozenset((link.a.key, link.b.key)) for link in links}
    seen_expected: set[frozenset[str]] = set()
    for want in expected:
        pair = frozenset((want.a.key, want.b.key))
        if pair in present or pair in seen_expected:
            continue
        seen_expected.add(pair)
        findings.append(
            Finding(
                "critical",
                "link-down",
                want.node,
                want.label,
                "expected link is not up (in the baseline/topology, missing now)",
            )
        )
    for link in links:
        findings.extend(_link_findings(link, expect_width, expect_rate))
        found = _counter_finding(link, counters, baseline_counters, thresholds)
        if found:
            findings.append(found)
    named = {f.node for f in findings if f.node}
    in_fabric = {link.node for link in links if link.node}
    for node in sorted(set(expect_nodes) - in_fabric - named):
        findings.append(
            Finding("critical", "node-missing", node, "-", "no HCA of this node is in the fabric")
        )
    return sorted(findings, key=lambda f: f.sort_key)


def _link_findings(
    link: Link, expect_width: str | None, expect_rate: float | None
) -> list[Finding]:
    out = []
    reasons = []
    if link.could_be_width:
        reasons.append(f"width {link.width}, could be {link.could_be_width}")
    if link.could_be_speed:
        reasons.append(f"speed {link.speed}, could be {link.could_be_speed}")
    if expect_width and lane_count(link.width) < lane_count(expect_width):
        reasons.append(f"width {link.width} below expected {expect_width.upper()}")
    if expect_rate and link.rate < expect_rate:
        reasons.append(f"rate {link.rate:g} Gb/s below expected {expect_rate:g} Gb/s")
    if reasons:
        out.append(
            Finding(
                "error",
                "link-degraded",
                link.node,
                link.label,
                f"{link.width} {link.speed} ({link.rate:g} Gb/s): " + "; ".join(reasons),
                {"width": link.width, "speed": link.speed, "rate_gbps": link.rate},
            )
        )
    if link.state and link.state != "Active":
        out.append(
            Finding(
                "error",
                "link-not-active",
                link.node,
                link.label,
                f"physically up but {link.state} (is a subnet manager running?)",
                {"state": link.state},
            )
        )
    return out


def counter_increase(now: int, before: int | None) -> int:
    """Increase since the baseline; a smaller value means the counter was reset."""
    if before is None or now < before:
        return now
    return now - before


def _counter_finding(
    link: Link,
    counters: dict[str, dict[str, int]],
    baseline: dict[str, dict[str, int]] | None,
    thresholds: dict[str, int],
) -> Finding | None:
    parts = []
    values: dict[str, object] = {}
    for end in (link.a, link.b):
        now = counters.get(end.key)
        if not now:
            continue
        before = (baseline or {}).get(end.key) if baseline is not None else None
        over = []
        for name, limit in thresholds.items():
            if name not in now:
                continue
            if baseline is not None:
                value = counter_increase(now[name], (before or {}).get(name))
                text = f"{name} +{value}"
            else:
                value = now[name]
                text = f"{name}={value}"
            if value > limit:
                over.append(text)
                values[f"{end.label}:{name}"] = value
        if over:
            parts.append(f"{end.label}: " + ", ".join(over))
    if not parts:
        return None
    mode = "since baseline" if baseline is not None else "since last reset"
    return Finding(
        "warning", "port-errors", link.node, link.label, "; ".join(parts) + f" ({mode})", values
    )


def format_table(findings: list[Finding]) -> str:
    """A fixed-width table, worst first; the empty audit says so in one line."""
    if not findings:
        return "ib audit: no problems found"
    rows = [("SEVERITY", "NODE", "CHECK", "WHERE", "DETAIL")]
    rows += [(f.severity, f.node or "-", f.check, f.where, f.detail) for f in findings]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4]
             for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def format_links(links: list[Link]) -> str:
    rows = [("NODE", "END A", "END B", "WIDTH", "SPEED", "GB/S", "STATE", "COULD BE")]
    for link in links:
        could = " ".join(x for x in (link.could_be_width, link.could_be_speed) if x)
        rows.append(
            (link.node or "-", link.a.label, link.b.label, link.width, link.speed,
             f"{link.rate:g}", link.state, could or "-")
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    )
