"""The saved audit: what ``ib audit --json`` prints and ``--save`` writes, and what
``--baseline`` reads back. One owner for the format, so writer and reader cannot drift.

Version 1, a JSON object: ``version``, ``created`` (Unix time), ``findings`` (each
``audit.Finding`` as a dict), ``links`` (``Link.to_dict``, with ``rate_gbps``), ``counters``
(port key -> counter name -> value, as perfquery read them) and ``errors`` (counters not
read). A baseline uses ``links`` (expected links: a missing one is ``link-down``) and
``counters`` (thresholds then apply to the increase since)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurmfabric.errors import UsageError
from slurmfabric.ibaudit.audit import Finding, Link

VERSION = 1


@dataclass
class AuditDocument:
    """One audit run, as saved."""

    created: float
    findings: list[Finding]
    links: list[Link]
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "version": VERSION,
            "created": self.created,
            "findings": [asdict(f) for f in self.findings],
            "links": [link.to_dict() for link in self.links],
            "counters": self.counters,
            "errors": self.errors,
        }

    def save(self, path: str | Path) -> None:
        """Write it for a later ``--baseline`` (the same text ``--json`` prints)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


@dataclass
class Baseline:
    """What a later audit compares against: the links and counters of a saved audit."""

    links: list[Link]
    counters: dict[str, dict[str, int]]


def load_baseline(path: str) -> Baseline:
    """A saved audit (``--save`` or ``--json`` output) as a baseline; anything without a
    list of link objects is refused with the file named."""
    from slurmfabric._common.inputfile import read_json

    data = read_json(path, "baseline")
    if not isinstance(data, dict) or not isinstance(data.get("links"), list) or not all(
            isinstance(link, dict) for link in data["links"]):
        raise UsageError(f"baseline {path} has no 'links'; was it written by 'ib audit'?")
    return Baseline(links=[Link.from_dict(item) for item in data["links"]],
                    counters=data.get("counters") or {})
