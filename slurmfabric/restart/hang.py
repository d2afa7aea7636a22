"""The supervisor's eye on the ranks' heartbeats: hang and slow findings while the job runs.

``Watcher.poll()`` reads the beats (``slurmfabric.progress``) from the job's progress
directory every ``every`` seconds, feeds ``progress.watch.Watch`` (which decides) and
writes the Prometheus textfile; ``culprits()`` runs the stack diagnosis
(``progress.diagnose``: one ``srun --overlap`` step inside the allocation) and returns the
lines for the job log and the nodes to leave out of the next start. The directory must be
one the batch shell can read: shared storage, or each node's beats collected there.

A program that does not call the helper writes no beats; then ``LogSilence`` stands in: the
launch's output goes to the job's output file, which the batch shell holds open as its
stdout, so the file's size (``fstat(2)`` of fd 1) grows whenever a rank prints. No growth
for longer than the hang timeout is a hang (``Finding.signal = "log_silence"``); the
first hang timeout after the launch starts is not counted (imports, data loading). It is
watched only while no rank has written a beat in this run (a program with the helper may
print rarely), and only when stdout is a regular file (not a pipe, a terminal or
/dev/null); the supervisor's own lines only delay it. Ranks whose output goes elsewhere
(``launcher.task_output``) leave it nothing to see.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from dataclasses import dataclass, field

from slurmfabric.progress.watch import Beat, Finding, Watch, prom_text, read_beats


@dataclass
class LogSilence:
    """No output from the launch for longer than ``timeout``: the size of the file open
    as ``fd`` stopped growing. One finding per silence; output clears it."""

    fd: int
    timeout: float
    size: int = -1
    since: float = 0.0
    fired: bool = False

    def poll(self, now: float) -> Finding | None:
        try:
            info = os.fstat(self.fd)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        if self.size < 0:  # the launch starts: imports and data loading print little,
            # so the first silence gets twice the timeout
            self.size, self.since = info.st_size, now + self.timeout
            return None
        if info.st_size != self.size:
            self.size, self.since, self.fired = info.st_size, max(now, self.since), False
            return None
        quiet = now - self.since
        if quiet <= self.timeout or self.fired:
            return None
        self.fired = True
        return Finding("hang", [], f"the launch printed nothing for {quiet:.0f} s and no "
                       "rank writes heartbeats (slurmfabric.progress.step)", now,
                       signal="log_silence", since=self.since)


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

    log_fd: int | None = None  # the launch's output (fd 1); None: log silence not watched
    silence: LogSilence | None = field(init=False, default=None)
    beating: bool = False  # a rank wrote a beat in this run

    def __post_init__(self) -> None:
        self.watch = Watch(timeout=self.timeout, slow_ratio=self.slow_ratio)
        if self.log_fd is not None:
            self.silence = LogSilence(self.log_fd, self.timeout)

    def poll(self, now: float | None = None) -> list[Finding]:
        """New findings, at most once every ``every`` seconds."""
        now = time.time() if now is None else now
        if now < self.next_poll:
            return []
        self.next_poll = now + self.every
        self.beats = read_beats(self.directory) if self.directory else {}
        self.beating = self.beating or bool(self.beats)
        found = self.watch.observe(self.beats, now)
        if self.silence is not None and not self.beating:
            quiet = self.silence.poll(now)
            found += [quiet] if quiet is not None else []
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
