"""``ib audit --drain``: which findings drain which node, through the health hooks' drain.

Same reason format (``slurmfabric: fabric-<check>: <detail>``) and the same rules as the
hooks: a node carrying someone else's reason keeps it; the circuit breaker applies.
Warnings (error counters) are reported, not drained. One drain per node, for its worst
finding."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurmfabric.ibaudit.audit import Finding

if TYPE_CHECKING:
    from slurmfabric.health.drain import DrainOutcome, DrainPolicy


def drain_findings(findings: list[Finding],
                   policy: DrainPolicy) -> list[tuple[str, DrainOutcome]]:
    """Drain each node with an error or critical finding once; (node, outcome) in the
    findings' order (worst first)."""
    from slurmfabric.health import drain as drain_mod

    done: set[str] = set()
    out = []
    for finding in findings:  # sorted worst first
        if not finding.node or finding.node in done or finding.severity == "warning":
            continue
        done.add(finding.node)
        out.append((finding.node, drain_mod.drain(
            finding.node, f"fabric-{finding.check}", f"{finding.where}: {finding.detail}",
            policy)))
    return out
