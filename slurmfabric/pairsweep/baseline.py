"""Baselines of pair sweeps: what each node and pair measured when the fabric was known good,
and the drift of a later sweep from it.

A baseline is built from one or more sweeps (``pairs baseline``): per node the median of its
pairs in each sweep, per pair its last measurement in each sweep, kept as median, minimum and
maximum over the sweeps. A later sweep drifts where a node's median (or a pair) falls more
than ``fraction`` (default 5 %, Microsoft SuperBench's rule) below the baseline's median. The
baseline is JSON, written and read whole; a node or pair it does not know is not judged.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from slurmfabric.errors import UsageError
from slurmfabric.pairsweep.plan import Pair

VERSION = 1
DEFAULT_DRIFT = 0.05


def _key(pair: Pair) -> str:
    a, b = sorted(pair)
    return f"{a}+{b}"


def node_medians(values: dict[Pair, float | None]) -> dict[str, float]:
    of_node: dict[str, list[float]] = {}
    for pair, value in values.items():
        if value is not None:
            for node in pair:
                of_node.setdefault(node, []).append(value)
    return {n: statistics.median(v) for n, v in sorted(of_node.items())}


def _stats(samples: list[float]) -> dict[str, float | int]:
    return {"median": round(statistics.median(samples), 3), "min": min(samples),
            "max": max(samples), "samples": len(samples)}


def build(sweeps: list[tuple[str, dict[Pair, float | None]]]) -> dict:
    """``sweeps``: (name, each pair's last value) per sweep -> the baseline document."""
    nodes: dict[str, list[float]] = {}
    pairs: dict[str, list[float]] = {}
    for _, values in sweeps:
        for node, median in node_medians(values).items():
            nodes.setdefault(node, []).append(median)
        for pair, value in values.items():
            if value is not None:
                pairs.setdefault(_key(pair), []).append(value)
    return {"version": VERSION, "sweeps": [name for name, _ in sweeps],
            "nodes": {n: _stats(v) for n, v in sorted(nodes.items())},
            "pairs": {p: _stats(v) for p, v in sorted(pairs.items())}}


def from_sweeps(results: list[Path]) -> dict:
    """``pairs baseline``: the baseline of these sweeps' results directories, each named by
    its absolute path and judged by its pairs' last measurements (a retest replaces)."""
    from slurmfabric.pairsweep.report import latest, load_results

    sweeps = []
    for path in results:
        _, pairs = load_results(path)
        sweeps.append((str(path.resolve()), latest(pairs)[0]))
    return build(sweeps)


def read(path: str) -> dict:
    from slurmfabric._common.inputfile import read_json, shape_error

    data = read_json(path, "pair-sweep baseline")
    try:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version') if isinstance(data, dict) else '?'}"
                             f", expected {VERSION}")
        for table in ("nodes", "pairs"):
            for name, entry in data[table].items():
                if not isinstance(name, str) or not isinstance(entry["median"], (int, float)) \
                        or isinstance(entry["median"], bool):
                    raise ValueError(f"{table}.{name}: no numeric median")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise shape_error(path, "pair-sweep baseline", exc,
                          "a file written by 'slurmfabric pairs baseline'") from None
    return data


def write(path: Path, baseline: dict) -> None:
    if path.exists() and path.is_dir():
        raise UsageError(f"-o {path}: is a directory", hint="give a file name")
    path.write_text(json.dumps(baseline, indent=1, sort_keys=True) + "\n")


@dataclass(frozen=True)
class Drift:
    what: str  # a node name or "a+b"
    kind: str  # "node" | "pair"
    now: float
    baseline: float

    @property
    def drop(self) -> float:
        return 1.0 - self.now / self.baseline

    def message(self) -> str:
        return (f"{self.kind} {self.what} at {self.now:.1f} GB/s, {100 * self.drop:.0f} % below "
                f"its baseline {self.baseline:.1f} GB/s")


def drift(values: dict[Pair, float | None], baseline: dict,
          fraction: float = DEFAULT_DRIFT) -> list[Drift]:
    """Nodes, then pairs, that fell more than ``fraction`` below their baseline median."""
    found = []
    for node, median in node_medians(values).items():
        ref = baseline["nodes"].get(node)
        if ref and ref["median"] > 0 and median < ref["median"] * (1.0 - fraction):
            found.append(Drift(node, "node", median, float(ref["median"])))
    for pair, value in sorted(values.items()):
        ref = baseline["pairs"].get(_key(pair))
        if value is not None and ref and ref["median"] > 0 and \
                value < ref["median"] * (1.0 - fraction):
            found.append(Drift(_key(pair), "pair", value, float(ref["median"])))
    return found
