"""Resume after a timeout, preemption, node failure or worker failure: the program's side.

A job rendered with ``[launcher.resume]`` runs its launch under ``slurmfabric resume
supervise`` (the batch shell, ``slurmfabric.restart.supervisor``), which puts this contract
in every rank's environment. A training script can honour it with or without this module:

- ``SLURMFABRIC_CHECKPOINT_DIR``: where checkpoints live. It is the same directory for every
  requeue and every chained successor of the job.
- ``SLURMFABRIC_RESTART_COUNT``: how many times the job has restarted (0 the first time).
- ``SLURMFABRIC_SAVE_REQUEST``: a file path. Once the file exists, write a checkpoint now and
  keep going: the supervisor stops the job when the checkpoint is complete (or at the grace
  deadline). It is a file, not a signal, because NCCL, torchrun and the MPI launchers catch
  or re-route signals, and writing a checkpoint inside a signal handler can hang
  (https://github.com/Lightning-AI/pytorch-lightning/issues/21406).
- ``SLURMFABRIC_CHECKPOINT_KEEP``: how many complete checkpoints to keep.

Checkpoints are directories ``step-<N>`` under the checkpoint directory. Each is written as
``.step-<N>.tmp-<pid>`` first and renamed when complete (rename(2) is atomic within one
file system), so a job killed mid-write never leaves a checkpoint that looks complete.
Standard library only: this runs in every rank.
"""

from __future__ import annotations

import os
import shutil
import time

from slurmfabric.restart import events

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Checkpoints", "checkpoint_dir", "restart_count", "save_requested"]

_PREFIX = "step-"


def checkpoint_dir() -> str | None:
    return os.environ.get("SLURMFABRIC_CHECKPOINT_DIR") or None


def restart_count() -> int:
    value = os.environ.get("SLURMFABRIC_RESTART_COUNT", "0")
    return int(value) if value.isdigit() else 0


def save_requested() -> bool:
    """True once the supervisor asks for a checkpoint: one stat(2), cheap enough per step."""
    path = os.environ.get("SLURMFABRIC_SAVE_REQUEST")
    return bool(path) and os.path.exists(path)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpoints:
    """Atomic ``step-<N>`` checkpoint directories; the newest ``keep`` are kept."""

    def __init__(self, directory: str | None = None, keep: int | None = None) -> None:
        directory = directory or checkpoint_dir()
        if not directory:
            raise ValueError("no checkpoint directory: set SLURMFABRIC_CHECKPOINT_DIR "
                             "(launcher.resume.checkpoint_dir) or pass one")
        self.directory = directory
        kept = os.environ.get("SLURMFABRIC_CHECKPOINT_KEEP", "2")
        self.keep = max(1, keep if keep is not None else int(kept) if kept.isdigit() else 2)
        self._first = True
        self._last_mark = 0.0

    def steps(self) -> list[int]:
        """The steps of complete checkpoints, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(name[len(_PREFIX):]) for name in names
                      if name.startswith(_PREFIX) and name[len(_PREFIX):].isdigit())

    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"{_PREFIX}{step:09d}")

    def latest(self) -> tuple[int, str] | None:
        """(step, directory) of the newest complete checkpoint, or None."""
        steps = self.steps()
        return (steps[-1], self.path(steps[-1])) if steps else None

    def save(self, step: int, write: Callable[[str], None]) -> str:
        """``write(tmpdir)`` fills a fresh directory, which is then published as step N."""
        os.makedirs(self.directory, exist_ok=True)
        tmp = os.path.join(self.directory, f".{_PREFIX}{step:09d}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp)
        write(tmp)
        for name in os.listdir(tmp):
            if os.path.isfile(os.path.join(tmp, name)):
                _fsync(os.path.join(tmp, name))
        final = self.path(step)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(self.directory)
        for old in self.steps()[:-self.keep]:
            shutil.rmtree(self.path(old), ignore_errors=True)
        return final

    def mark(self, step: int, every: float = 0.0) -> None:
        """Record the step reached for the restart report. Call from one rank. The first
        call of a process also logs when training resumed, and from which step."""
        now = time.time()
        if self._first:
            self._first = False
            before = events.read_progress(self.directory) or {}
            events.append(self.directory, {
                "event": "first_step", "time": now, "step": step,
                "run": os.environ.get("SLURMFABRIC_RUN_ID", ""),
                "job": os.environ.get("SLURM_JOB_ID", ""), "restart": restart_count(),
                "worker_restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
                "previous_step": before.get("step"), "previous_time": before.get("time"),
            })
        elif now - self._last_mark < every:
            return
        self._last_mark = now
        events.write_progress(self.directory, {"step": step, "time": now})
