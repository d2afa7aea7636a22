"""Cluster-wide RoCE audit: every node's ports sampled twice by one Slurm step, then the
nodes whose settings differ from the majority or the profile, worst first, and the ports
whose loss and pause counters grow fastest.

One file per node and sample, ``<node>.<k>.json`` (``slurmfabric roce facts --output-dir``):
``{"node", "time", "ports": [RocePort.to_dict()]}``. The report is a pure function of those
files: the same results give the same report.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from slurmfabric.roce.facts import RocePort
from slurmfabric.roce.profile import LOSS, PAUSE, Profile, differences

SETTINGS = ("mtu", "trust", "pfc", "ecn_np", "ecn_rp", "roce_tos", "cnp_dscp")
_SAMPLE = re.compile(r"^(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,63})\.(?P<k>[01])\.json$")


@dataclass
class Sample:
    node: str
    time: float
    ports: list[RocePort]


@dataclass
class Growth:
    node: str
    port: str
    loss_per_s: float
    pause_per_s: float
    top: list[tuple[str, float]]  # the fastest-growing counters, per second

    def line(self) -> str:
        counters = ", ".join(f"{name} +{rate:.3g}/s" for name, rate in self.top)
        return f"{self.node} {self.port}: {counters}"


@dataclass
class Finding:
    node: str
    problems: list[str] = field(default_factory=list)


@dataclass
class Report:
    nodes: list[str]
    findings: list[Finding]  # worst first; only nodes with problems
    growth: list[Growth]  # fastest first; only ports whose counters grew
    missing: list[str]  # nodes without both samples
    unseen: dict[str, list[str]]  # node -> what it could not read


def _read(path: Path) -> Sample:
    from slurmfabric._common.inputfile import read_json, shape_error

    data = read_json(str(path), "RoCE facts")
    try:
        return Sample(str(data["node"]), float(data["time"]),
                      [RocePort.from_dict(p) for p in data["ports"]])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise shape_error(str(path), "RoCE facts", exc, "a file written by "
                          "'slurmfabric roce facts --output-dir'") from None


def load(results: Path) -> dict[str, list[Sample]]:
    """node -> its samples in order; files not named like a sample are not ours."""
    from slurmfabric.errors import UsageError

    if not results.is_dir():
        raise UsageError(f"{results}: not a directory",
                         hint="pass the results directory given to 'roce audit'")
    found: dict[str, dict[int, Sample]] = {}
    for path in sorted(results.iterdir()):
        m = _SAMPLE.match(path.name)
        if m:
            found.setdefault(m["node"], {})[int(m["k"])] = _read(path)
    return {node: [s[k] for k in sorted(s)] for node, s in sorted(found.items())}


def _value(port: RocePort, setting: str) -> object:
    value = getattr(port, setting)
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _show(setting: str, value: object) -> str:
    if setting in ("pfc", "ecn_np", "ecn_rp") and isinstance(value, tuple):
        on = [p for p, flag in enumerate(value) if flag]
        return f"{setting} on {on or 'no priority'}"
    return f"{setting} {value}"


def analyze(samples: dict[str, list[Sample]],
            profiles: dict[str, Profile] | None = None) -> Report:
    nodes = sorted(samples)
    first = {n: {p.name: p for p in s[0].ports} for n, s in samples.items() if s}
    findings: dict[str, Finding] = {n: Finding(n) for n in nodes}
    # Majority per port name and setting, over the nodes that could read it.
    names = sorted({name for ports in first.values() for name in ports})
    for name in names:
        having = {n: ports[name] for n, ports in first.items() if name in ports}
        for setting in SETTINGS:
            values = {n: _value(p, setting) for n, p in having.items()
                      if _value(p, setting) is not None}
            if len(values) < 3:
                continue  # no majority among fewer than three
            common, count = Counter(values.values()).most_common(1)[0]
            if 2 * count <= len(values):
                continue
            for node, value in values.items():
                if value != common:
                    findings[node].problems.append(
                        f"{having[node].label()}: {_show(setting, value)} (majority: "
                        f"{_show(setting, common)} on {count} of {len(values)} nodes)")
    for node, ports in first.items():
        profile = (profiles or {}).get(node)
        if profile is None:
            continue
        for port in ports.values():
            for diff in differences(port, profile):
                findings[node].problems.append(f"{port.label()}: {diff} [profile]")
    missing = [n for n in nodes if len(samples[n]) < 2]
    growth = []
    for node in nodes:
        if len(samples[node]) < 2:
            continue
        a, b = samples[node][0], samples[node][1]
        seconds = max(b.time - a.time, 1e-3)
        before = {p.name: p.counters for p in a.ports}
        for port in b.ports:
            old = before.get(port.name, {})
            rates = {c: (v - old[c]) / seconds for c, v in port.counters.items()
                     if c in old and v > old[c] and (c in LOSS or c in PAUSE)}
            if rates:
                loss = sum(r for c, r in rates.items() if c in LOSS)
                pause = sum(r for c, r in rates.items() if c in PAUSE)
                top = sorted(rates.items(), key=lambda kv: (-(kv[0] in LOSS), -kv[1], kv[0]))
                growth.append(Growth(node, port.label(), loss, pause, top[:4]))
    growth.sort(key=lambda g: (-g.loss_per_s, -g.pause_per_s, g.node, g.port))
    bad = [f for f in findings.values() if f.problems]
    # Worst first: a difference from the declared profile counts twice one from the majority.
    bad.sort(key=lambda f: (-sum(2 if p.endswith("[profile]") else 1 for p in f.problems),
                            f.node))
    unseen = {n: sorted({u for p in first[n].values() for u in p.unseen}) for n in first
              if any(p.unseen for p in first[n].values())}
    return Report(nodes, bad, growth, missing, unseen)


def prometheus(samples: dict[str, list[Sample]], report: Report) -> str:
    """Textfile-collector format (node_exporter): the last sample's counters per node and
    port, each port's loss and pause growth per second, and settings findings per node."""
    from slurmfabric._common.prom import labels as prom_labels

    lines = ["# HELP slurmfabric_roce_counter RoCE port counter (ethtool -S, hw_counters)",
             "# TYPE slurmfabric_roce_counter counter"]
    for node, node_samples in sorted(samples.items()):
        for port in node_samples[-1].ports:
            for counter, value in sorted(port.counters.items()):
                labels = prom_labels(("node", node), ("port", port.name),
                                      ("counter", counter))
                lines.append(f"slurmfabric_roce_counter{labels} {value}")
    lines += ["# HELP slurmfabric_roce_loss_per_second growth of loss counters",
              "# TYPE slurmfabric_roce_loss_per_second gauge"]
    for g in report.growth:
        labels = prom_labels(("node", g.node), ("port", g.port))
        lines.append(f"slurmfabric_roce_loss_per_second{labels} {g.loss_per_s:.6g}")
    lines += ["# HELP slurmfabric_roce_setting_findings settings differing from the majority "
              "or the profile", "# TYPE slurmfabric_roce_setting_findings gauge"]
    counts = {f.node: len(f.problems) for f in report.findings}
    for node in report.nodes:
        lines.append(f"slurmfabric_roce_setting_findings{prom_labels(('node', node),)} "
                     f"{counts.get(node, 0)}")
    return "\n".join(lines) + "\n"


def to_json(report: Report) -> str:
    return json.dumps({
        "nodes": report.nodes,
        "findings": [{"node": f.node, "problems": f.problems} for f in report.findings],
        "growth": [{"node": g.node, "port": g.port, "loss_per_s": g.loss_per_s,
                    "pause_per_s": g.pause_per_s, "top": [[c, r] for c, r in g.top]}
                   for g in report.growth],
        "missing": report.missing, "unseen": report.unseen,
    }, indent=2)
