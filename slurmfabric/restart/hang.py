"""The supervisor's eye on the ranks' heartbeats: hang and slow findings while the job runs.

``Watcher.poll()`` reads the beats (``slurmfabric.progress``) from the job's progress
directory every ``every`` seconds, feeds ``progress.watch.Watch`` (which decides) and
writes the Prometheus textfile; ``culprits()`` runs the stack diagnosis
(``progress.diagnose``: one ``srun --overlap`` step inside the allocation) and returns the
lines for the job log and the nodes to leave out of the next start. The directory must be
one the batch shell can read: shared storage, or each node's beats collected there.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from slurmfabric.progress.watch import Beat, Finding, Watch, prom_text, read_beats


@dataclass
class Watcher:
    directory: str
    job: str
    timeout: float = 300.0
    slow_ratio: float = 1.10
    prom: str = ""  # the textfile's path; empty: none
    every: float = 5.0
    watch: Watch = field(init=False)
    beats: dict[int, Beat] = field(default_factory=dict)
    next_poll: float = 0.0

    def __post_init__(self) -> None:
        self.watch = Watch(timeout=self.timeout, slow_ratio=self.slow_ratio)

    def poll(self, now: float | None = None) -> list[Finding]:
        """New findings, at most once every ``every`` seconds."""
        now = time.time() if now is None else now
        if now < self.next_poll:
            return []
        self.next_poll = now + self.every
        self.beats = read_beats(self.directory)
        found = self.watch.observe(self.beats, now)
        if self.prom:
            from slurmfabric._common import prom

            # the textfile is a report, never a reason to stop the job
            with contextlib.suppress(OSError):
                prom.write_textfile(self.prom, prom_text(self.watch, self.beats, self.job, now))
        return found


def culprits(finding: Finding, job_id: str, timeout: float = 60.0,
             env: dict[str, str] | None = None) -> tuple[list[str], list[str], dict[str, object]]:
    """(log lines, culprit nodes, the diagnosis as data) for a finding: the stack
    diagnosis names them when it can, else the heartbeats' laggards do."""
    from slurmfabric.errors import SlurmfabricError
    from slurmfabric.progress.diagnose import diagnose

    lines: list[str] = []
    named: list[dict[str, object]] = []
    data: dict[str, object] = {}
    if finding.kind == "hang":
        try:
            result = diagnose(job_id, timeout=timeout, env=env)
        except SlurmfabricError as error:
            lines.append(f"diagnosis failed: {error}")
        else:
            data = result.to_dict()
            lines += [f"diagnosis: {line}" for line in result.text().splitlines()]
            named = list(result.culprits)
    if not named:
        named = list(finding.ranks)
    nodes = sorted({str(c["host"]) for c in named if c.get("host")})
    return lines, nodes, data
