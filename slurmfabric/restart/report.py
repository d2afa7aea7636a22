"""What each restart of a job cost: when, why, the steps redone and the time lost.

Built from the event log (``slurmfabric.restart.events``). The time lost is measured from
the event (the warning, Slurm's SIGTERM, or the last step before a silent failure) to the
first training step after the restart, so it includes Slurm's requeue delay and the
program's own start-up.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from slurmfabric.restart import events

INTERRUPTIONS = ("timeout", "preempt", "node_fail", "worker_fail", "hang", "slow", "unknown")


@dataclass
class Restart:
    reason: str
    when: float
    job: str
    nodes: list[str] = field(default_factory=list)
    exit_code: int | None = None
    step_reached: int | None = None
    resumed_from: int | None = None
    resumed_at: float | None = None
    action: str = ""

    @property
    def steps_redone(self) -> int | None:
        if self.step_reached is None or self.resumed_from is None:
            return None
        return max(0, self.step_reached - self.resumed_from)

    @property
    def seconds_lost(self) -> float | None:
        return None if self.resumed_at is None else max(0.0, self.resumed_at - self.when)


@dataclass
class History:
    run: str
    restarts: list[Restart]
    final: dict[str, object] | None  # the last end event, if the run has ended

    @property
    def seconds_lost(self) -> float:
        return sum(r.seconds_lost or 0.0 for r in self.restarts)

    @property
    def steps_redone(self) -> int:
        return sum(r.steps_redone or 0 for r in self.restarts)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def history(directory: str, run: str | None = None) -> History | None:
    """The restarts of ``run`` (default: the run that started last), oldest first."""
    every = events.read(directory)
    if run is None:
        starts = [e for e in every if e.get("event") == "start"]
        if not starts:
            return None
        run = str(starts[-1].get("run", ""))
    log = [e for e in every if e.get("run") == run]
    restarts: list[Restart] = []
    final: dict[str, object] | None = None
    trained = False  # a first_step since the last start: a second one is a worker restart
    for index, record in enumerate(log):
        kind = record.get("event")
        if kind == "end":
            final = record
            if record.get("reason") not in INTERRUPTIONS or record.get("final"):
                continue
            later = log[index + 1:]
            start = next((e for e in later if e.get("event") == "start"), None)
            first = next((e for e in later if e.get("event") == "first_step"), None)
            restarts.append(Restart(
                reason=str(record.get("reason")), when=_float(record.get("time")) or 0.0,
                job=str(record.get("job", "")), nodes=_names(record.get("nodes")),
                exit_code=_int(record.get("exit_code")),
                step_reached=_int(record.get("step_reached")),
                resumed_from=_int(start.get("from_step")) if start else None,
                resumed_at=_float(first.get("time")) if first else None,
                action=str(record.get("action", ""))))
        elif kind == "first_step" and not trained:
            trained = True
        elif kind == "first_step":
            step = _int(record.get("step"))
            restarts.append(Restart(
                reason="worker_fail", when=_float(record.get("previous_time")) or 0.0,
                job=str(record.get("job", "")), step_reached=_int(record.get("previous_step")),
                resumed_from=None if step is None else step - 1,
                resumed_at=_float(record.get("time")),
                action="torchrun restarted the workers in place"))
        elif kind == "start":
            final, trained = None, False
    return History(run=run, restarts=restarts, final=final)


def _names(value: object) -> list[str]:
    """A record's node list; the events file is read back, so a wrong shape is no list."""
    return [str(n) for n in value[:10_000]] if isinstance(value, list) else []


def _stamp(seconds: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, ValueError, OSError):  # a time no clock shows: say it as it is
        return f"t={seconds:g}"


def format_history(h: History) -> str:
    counts: dict[str, int] = {}
    for r in h.restarts:
        counts[r.reason] = counts.get(r.reason, 0) + 1
    kinds = ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
    lines = [f"restarts of run {h.run}: {len(h.restarts)} ({kinds}); steps redone "
             f"{h.steps_redone}; time lost {h.seconds_lost:.1f} s"]
    for i, r in enumerate(h.restarts, 1):
        why = r.reason
        if r.nodes:
            why += f" ({', '.join(r.nodes)})"
        if r.exit_code is not None:
            why += f" (exit {r.exit_code})"
        redone = "?" if r.steps_redone is None else str(r.steps_redone)
        lost = "?" if r.seconds_lost is None else f"{r.seconds_lost:.1f} s"
        lines.append(f"  {i}. {_stamp(r.when)} job {r.job}: {why}; step {r.step_reached} "
                     f"reached, resumed from {r.resumed_from} ({redone} redone); "
                     f"{lost} to the first resumed step; {r.action}")
    if h.final is not None:
        detail = h.final.get("reason")
        lines.append(f"final: {detail} at step {h.final.get('step_reached')}"
                     + (" (stopped)" if h.final.get("final") else ""))
    else:
        lines.append("final: still running")
    return "\n".join(lines)
