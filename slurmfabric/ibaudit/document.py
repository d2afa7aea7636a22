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
    from slurmfabric._common.inputfile import read_json, shape_error

    data = read_json(path, "baseline")
    if not isinstance(data, dict) or not isinstance(data.get("links"), list) or not all(
            isinstance(link, dict) for link in data["links"]):
        raise UsageError(f"baseline {path} has no 'links'; was it written by 'ib audit'?")
    try:
        links = [_link(item) for item in data["links"]]
        counters = data.get("counters") or {}
        if not isinstance(counters, dict) or not all(
                isinstance(v, dict) and all(_is_int(n) for n in v.values())
                for v in counters.values()):
            raise TypeError("'counters' is not an object of port -> {counter: integer}")
    except (KeyError, TypeError, ValueError) as exc:
        raise shape_error(path, "baseline", exc, "a file written by 'ib audit --save' or "
                          "'--json'") from None
    return Baseline(links=links, counters=counters)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_END_TYPES = {"key": str, "desc": str, "node_type": str, "lid": int, "port": int}
_LINK_TYPES = {"width": str, "speed": str, "state": str, "could_be_width": str,
               "could_be_speed": str}


def _link(item: dict) -> Link:
    """One saved link, each field of the type 'ib audit' writes (a number where a name
    belongs would fail deep inside the audit, not here with the file named)."""
    for end in ("a", "b"):
        fields = item[end]
        if not isinstance(fields, dict) or set(fields) != set(_END_TYPES):
            raise TypeError(f"link end '{end}' is not an object with {sorted(_END_TYPES)}")
        for name, kind in _END_TYPES.items():
            if not isinstance(fields[name], kind) or isinstance(fields[name], bool):
                raise TypeError(f"link end '{end}' field '{name}' is {fields[name]!r}")
    for name, kind in _LINK_TYPES.items():
        if name in item and not isinstance(item[name], kind):
            raise TypeError(f"link field '{name}' is {item[name]!r}")
    if item.get("node") is not None and not isinstance(item["node"], str):
        raise TypeError(f"link field 'node' is {item['node']!r}")
    return Link.from_dict(item)
