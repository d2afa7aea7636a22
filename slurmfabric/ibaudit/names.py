"""Map InfiniBand HCAs to Slurm node names.

By default the node name is the first word of the HCA's node description: rdma-core's
``rdma-ndd`` sets NodeDescription to ``"%h %d"`` (hostname, device), and older stacks wrote
``"<hostname> HCA-1"``, so ``"gpu017 mlx5_0"`` and ``"sfn01 HCA-1"`` both name their host.
Sites whose descriptions say something else give a regular expression (group 1 is the
name) or a mapping file in the infiniband-diags node-name-map format
(``0x<guid> "name"`` per line, ``#`` comments), keyed by node or port GUID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slurmfabric.errors import UsageError

DEFAULT_PATTERN = r"^\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)\s"

_MAP_LINE = re.compile(r"^\s*(0x[0-9a-fA-F]+)\s+\"([^\"]*)\"")


@dataclass(frozen=True)
class NodeNamer:
    """Turns a CA (GUID + description) into a Slurm node name, or None for switches."""

    by_guid: dict[str, str] = field(default_factory=dict)
    pattern: str = DEFAULT_PATTERN

    def name(self, guid: str, desc: str, node_type: str = "CA") -> str | None:
        mapped = self.by_guid.get(_norm(guid))
        if mapped:
            return mapped
        if node_type != "CA":
            return None
        match = re.search(self.pattern, desc + " ")
        return match.group(1) if match else None


def parse_node_map(text: str, source: str = "node map") -> dict[str, str]:
    """Parse node-name-map text into ``{guid: name}`` (GUIDs normalised to 16 hex digits)."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _MAP_LINE.match(stripped)
        if not match:
            raise UsageError(
                f"{source}:{number}: expected '0x<guid> \"name\"', got {stripped!r}",
                hint="use the infiniband-diags node-name-map format",
            )
        out[_norm(match.group(1))] = match.group(2).strip()
    return out


def load_namer(map_file: str | None, pattern: str | None) -> NodeNamer:
    by_guid: dict[str, str] = {}
    if map_file:
        from slurmfabric._common.inputfile import read_text

        text = read_text(map_file, "node map")
        by_guid = parse_node_map(text, map_file)
    if pattern:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"bad --name-pattern {pattern!r}: {exc}") from exc
        if compiled.groups < 1:
            raise UsageError(f"--name-pattern {pattern!r} needs a group for the node name")
    return NodeNamer(by_guid, pattern or DEFAULT_PATTERN)


def _norm(guid: str) -> str:
    guid = guid.strip().lower()
    if guid.startswith("0x"):
        guid = guid[2:]
    return "0x" + guid.rjust(16, "0") if guid else ""
