"""Fleet history: drains, resumes, flaps and lemon nodes over time, from Slurm's own records.

Source: slurmdbd's node events (``sacctmgr list events``, sacctmgr(1), "LIST/SHOW EVENT";
read by ``slurm.cmd.node_events``).
slurmctld records every change of a node to DRAIN or DOWN there, with the reason, the user
and a start time, and closes the event (its end time) when the node is resumed. That covers
every drain on every node, by slurmfabric's hooks, by an admin or by Slurm itself ("Prolog
error", "Not responding"), on any node, and survives node reimages; it needs no service
beyond slurmdbd, which a site that keeps job history (``sacct``) already runs. A shared state
directory would be a second record that hooks running as root must write over the network,
and would miss every drain slurmfabric did not make. Without slurmdbd there is no history to
read: the command says so (exit 2).

Definitions (per node, in the window):
- a *drain* is an event whose state has DRAIN or DOWN;
- an *undone* drain is one of ours that lasted at most ``undo_s`` seconds: the circuit
  breaker's undo (docs/health.md), which never took the node out of service for long;
- a *resume* is a drain event that has ended;
- a *flap* is a drain that follows an earlier drain of the same node in the window;
- a *lemon* is a node whose open event carries the lemon reason (``lemon.is_lemon``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from slurmfabric.health import lemon

OURS = "slurmfabric:"
SLURM_REASONS = ("Prolog error", "Epilog error", "Not responding", "Kill task failed",
                 "batch job complete failure", "cold-start")
DEFAULT_UNDO_S = 30.0


@dataclass(frozen=True)
class Event:
    node: str
    start: float
    end: float | None  # None: still open (the node is drained or down now)
    state: str
    user: str
    reason: str

    @property
    def by(self) -> str:
        """Who drained: slurmfabric (its reason prefix), slurm (Slurm's own reasons), admin."""
        if self.reason.startswith(OURS):
            return "slurmfabric"
        return "slurm" if self.reason.startswith(SLURM_REASONS) else "admin"

    def seconds(self, now: float) -> float:
        return (self.end if self.end is not None else now) - self.start


def _time(text: str) -> float | None:
    text = text.strip()
    if not text or text in ("Unknown", "None"):
        return None
    return dt.datetime.fromisoformat(text).timestamp()  # sacctmgr prints local time


def parse_events(rows: Iterable[Mapping[str, str]]) -> list[Event]:
    """slurmdbd's node event rows (``slurm.cmd.node_events``) -> drain/down events, oldest
    first. Rows without a node (cluster events) or without DRAIN/DOWN in the state
    (cold-start) are skipped."""
    events = []
    for row in rows:
        state = row["State"].upper()
        start = _time(row["TimeStart"])
        if not row["NodeName"] or start is None or not ("DRAIN" in state or "DOWN" in state):
            continue
        events.append(Event(row["NodeName"], start, _time(row["TimeEnd"]), row["State"],
                            row["User"], row["Reason"].strip()))
    return sorted(events, key=lambda e: (e.start, e.node))


@dataclass
class NodeHistory:
    node: str
    drains: int = 0
    by: dict[str, int] = field(default_factory=dict)
    undone: int = 0
    resumes: int = 0
    flaps: int = 0
    drained_now: bool = False
    lemon: bool = False
    last_reason: str = ""


def summarize(events: Iterable[Event], now: float,
              undo_s: float = DEFAULT_UNDO_S) -> dict[str, NodeHistory]:
    """Per node counts over ``events`` (see the module docstring for the definitions)."""
    nodes: dict[str, NodeHistory] = {}
    for event in sorted(events, key=lambda e: (e.start, e.node)):
        h = nodes.setdefault(event.node, NodeHistory(event.node))
        if event.by == "slurmfabric" and event.end is not None and \
                event.seconds(now) <= undo_s:
            h.undone += 1
            continue
        if h.drains:
            h.flaps += 1
        h.drains += 1
        h.by[event.by] = h.by.get(event.by, 0) + 1
        h.resumes += event.end is not None
        h.last_reason = event.reason
        h.drained_now = event.end is None
        h.lemon = event.end is None and lemon.is_lemon(event.reason)
    return nodes


def _stamp(when: float | None) -> str:
    return "-" if when is None else dt.datetime.fromtimestamp(when).strftime("%Y-%m-%dT%H:%M:%S")


def as_json(events: list[Event], nodes: dict[str, NodeHistory], start: float,
            end: float) -> dict:
    return {"since": _stamp(start), "until": _stamp(end), "source": "slurmdbd node events",
            "nodes": [asdict(h) for h in sorted(nodes.values(), key=_order)],
            "lemons": sorted(h.node for h in nodes.values() if h.lemon),
            "events": [{**asdict(e), "by": e.by, "start": _stamp(e.start),
                        "end": _stamp(e.end)} for e in events]}


def _order(h: NodeHistory) -> tuple:
    return (not h.lemon, -h.drains, -h.undone, h.node)


def as_text(events: list[Event], nodes: dict[str, NodeHistory], start: float, end: float,
            now: float, undo_s: float, last: int = 20) -> str:
    """A table per node (lemons first, then the most drained) and the latest events."""
    lemons = [h.node for h in nodes.values() if h.lemon]
    lines = [f"fleet history {_stamp(start)} .. {_stamp(end)} (slurmdbd node events): "
             f"{sum(h.drains for h in nodes.values())} drains on {len(nodes)} nodes, "
             f"{sum(h.flaps for h in nodes.values())} flaps, {len(lemons)} lemon nodes"
             + (f" ({', '.join(sorted(lemons))})" if lemons else "")]
    if not nodes:
        return lines[0]
    rows = [("NODE", "DRAINS", "BY", "RESUMES", "FLAPS", f"UNDONE<={undo_s:g}s", "NOW",
             "LAST REASON")]
    for h in sorted(nodes.values(), key=_order):
        now_word = "LEMON" if h.lemon else ("drained" if h.drained_now else "in service")
        by = ",".join(f"{k}:{v}" for k, v in sorted(h.by.items())) or "-"
        rows.append((h.node, str(h.drains), by, str(h.resumes), str(h.flaps), str(h.undone),
                     now_word, h.last_reason[:70] or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines.append(f"last {min(last, len(events))} of {len(events)} events:")
    for e in events[-last:]:
        took = f"resumed after {e.seconds(now):.0f} s" if e.end is not None else "open"
        lines.append(f"  {_stamp(e.start)}  {e.node}  {e.state}  {took}  {e.reason[:80]}")
    return "\n".join(lines)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def as_prometheus(nodes: dict[str, NodeHistory], window_h: float) -> str:
    """Prometheus text format (node_exporter's textfile collector): one series per node."""
    series = (
        ("drains", "drains in the window (not counting breaker undos)", lambda h: h.drains),
        ("resumes", "drains in the window that ended (the node was resumed)",
         lambda h: h.resumes),
        ("flaps", "drains that followed an earlier drain of the node in the window",
         lambda h: h.flaps),
        ("undone", "slurmfabric drains the circuit breaker undid at once", lambda h: h.undone),
        ("drained", "1: the node is drained or down now", lambda h: int(h.drained_now)),
        ("lemon", "1: the node is drained as a lemon (not auto-resumed)",
         lambda h: int(h.lemon)),
    )
    out = []
    for name, help_, get in series:
        metric = f"slurmfabric_fleet_{name}"
        out += [f"# HELP {metric} {help_} (window {window_h:g} h)", f"# TYPE {metric} gauge"]
        out += [f'{metric}{{node="{_label(h.node)}"}} {get(h)}'
                for h in sorted(nodes.values(), key=lambda h: h.node)]
    return "\n".join(out) + "\n"
