"""Prometheus textfile metrics for an ib audit (node_exporter textfile collector).

The file is written to a temporary name in the same directory and renamed, because the
collector may read it at any moment and must never see half a file.
"""

from __future__ import annotations

from slurmfabric._common import prom
from slurmfabric.ibaudit.audit import SEVERITIES, Finding, Link

_PREFIX = "slurmfabric_fabric"




def render(
    links: list[Link],
    counters: dict[str, dict[str, int]],
    findings: list[Finding],
    timestamp: float,
) -> str:
    """The exposition text: link rates, degradation flags, counters, findings per node."""
    out: list[str] = []

    def family(name: str, kind: str, help_: str) -> None:
        out.append(f"# HELP {_PREFIX}_{name} {help_}")
        out.append(f"# TYPE {_PREFIX}_{name} {kind}")

    family("link_rate_gbps", "gauge", "Active link rate (width x lane rate) in Gb/s.")
    for link in links:
        out.append(f"{_PREFIX}_link_rate_gbps{_link_labels(link)} {link.rate:g}")
    family("link_degraded", "gauge", "1 when iblinkinfo says the link could be wider/faster.")
    for link in links:
        flag = 1 if (link.could_be_width or link.could_be_speed) else 0
        out.append(f"{_PREFIX}_link_degraded{_link_labels(link)} {flag}")
    family("port_counter", "gauge", "perfquery counter value per port.")
    names = _names(links)
    for key in sorted(counters):
        guid, _, port = key.partition(":")
        desc, node = names.get(key, ("", ""))
        for counter, value in sorted(counters[key].items()):
            labels = prom.labels(guid=guid, port=port, desc=desc, node=node, counter=counter)
            out.append(f"{_PREFIX}_port_counter{labels} {value}")
    family("findings", "gauge", "Number of audit findings by severity.")
    for severity in SEVERITIES:
        count = sum(1 for f in findings if f.severity == severity)
        out.append(f"{_PREFIX}_findings{prom.labels(severity=severity)} {count}")
    family("node_problem", "gauge", "1 per node and check that has a finding.")
    for node, check in sorted({(f.node, f.check) for f in findings if f.node}):
        out.append(f"{_PREFIX}_node_problem{prom.labels(node=node, check=check)} 1")
    family("audit_timestamp_seconds", "gauge", "When the audit ran (Unix time).")
    out.append(f"{_PREFIX}_audit_timestamp_seconds {timestamp:.3f}")
    return "\n".join(out) + "\n"


def _link_labels(link: Link) -> str:
    return prom.labels(
        node=link.node or "",
        a=link.a.desc,
        a_port=str(link.a.port),
        b=link.b.desc,
        b_port=str(link.b.port),
    )


def _names(links: list[Link]) -> dict[str, tuple[str, str]]:
    names: dict[str, tuple[str, str]] = {}
    for link in links:
        names[link.a.key] = (link.a.desc, link.node or "")
        names[link.b.key] = (link.b.desc, link.node or "")
    return names
