"""The progress contract: each rank calls ``step()`` once per training step.

A rank started under a rendered script finds ``SLURMFABRIC_PROGRESS_DIR`` in its
environment and writes its heartbeat there: one small file per rank, ``rank-<R>.beat``,
overwritten in place at every call with one fixed-size ``pwrite(2)`` (no lock, no
rename, no fsync: a few microseconds). The supervisor reads them
(``slurmfabric.progress.watch``) to tell a hang (no rank advanced for longer than the
timeout, or one rank stayed behind while the others advanced) and a slow rank (its
compute time per step persistently over its peers' median). Without the variable every
call is a no-op, so a program can call it unconditionally.

    import slurmfabric.progress as progress
    for batch in loader:
        with progress.compute():        # the part of the step outside collectives
            loss = model(batch); loss.backward()
        optimizer.step()                # all_reduce inside: not timed
        progress.step()

``compute()`` times its block and marks the rank as having entered the step's
communication; ``step(compute_seconds=...)`` is the alternative for programs that time
the compute part themselves. The record is JSON padded with spaces to ``RECORD`` bytes:
a reader that catches a write half done sees two consecutive beats of one rank mixed, or
text that does not parse (skipped until the next read). The supervisor reads every
rank's beats from the batch shell's node, so a rendered job puts the directory under its
checkpoint directory, which every node shares (docs/progress.md: NFS delays the beats by
its caches, keep the hang timeout above them); ``collect`` reads the beats on each node.

Standard library only, imported by every rank: nothing here may import more.
"""

from __future__ import annotations

import os
import time

__all__ = ["ENV", "RECORD", "compute", "enabled", "step"]

ENV = "SLURMFABRIC_PROGRESS_DIR"
RECORD = 320  # bytes per beat; the reader accepts any length up to 4 KiB


class _Beat:
    """One rank's heartbeat file and running totals."""

    __slots__ = ("fd", "head", "step", "compute_sum", "timed", "pending")

    def __init__(self, directory: str) -> None:
        env = os.environ
        rank = env.get("RANK") or env.get("SLURM_PROCID") or "0"
        rank = rank if rank.isdigit() else "0"
        host = (env.get("SLURMD_NODENAME") or os.uname().nodename).replace('"', "")
        local = env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or ""
        gpus = env.get("CUDA_VISIBLE_DEVICES", "").replace('"', "")
        os.makedirs(directory, exist_ok=True)
        self.fd = os.open(os.path.join(directory, f"rank-{int(rank)}.beat"),
                          os.O_WRONLY | os.O_CREAT, 0o644)
        self.head = (f'{{"rank":{int(rank)},"pid":{os.getpid()},"host":"{host[:64]}",'
                     f'"local":"{local[:8]}","gpus":"{gpus[:64]}",')
        self.step = 0
        self.compute_sum = 0.0
        self.timed = 0
        self.pending: float | None = None

    def write(self, phase: str, last: float | None) -> None:
        text = (f'{self.head}"step":{self.step},"phase":"{phase}","time":{time.time():.6f},'
                f'"compute":{"null" if last is None else f"{last:.6f}"},'
                f'"compute_sum":{self.compute_sum:.6f},"timed":{self.timed}}}')
        os.pwrite(self.fd, text.ljust(RECORD).encode(), 0)


_beat: _Beat | None = None
_checked = False


def _get() -> _Beat | None:
    global _beat, _checked
    if not _checked:
        _checked = True
        directory = os.environ.get(ENV)
        if directory:
            try:  # noqa: SIM105 (cheaper than contextlib.suppress per step)
                _beat = _Beat(directory)
            except OSError:
                _beat = None  # progress must never stop training
    return _beat


def enabled() -> bool:
    """True when this rank writes heartbeats (``SLURMFABRIC_PROGRESS_DIR`` is set)."""
    return _get() is not None


def step(compute_seconds: float | None = None, step: int | None = None) -> None:
    """One step done. ``compute_seconds``: this step's time outside collectives (else
    what ``compute()`` measured, if it was used); ``step``: the program's own step
    number (a resumed job starts past 0), else one more than the last."""
    beat = _beat if _checked else _get()
    if beat is None:
        return
    beat.step = beat.step + 1 if step is None else int(step)
    last = compute_seconds if compute_seconds is not None else beat.pending
    beat.pending = None
    if last is not None:
        beat.compute_sum += last
        beat.timed += 1
    try:  # noqa: SIM105 (cheaper than contextlib.suppress per step)
        beat.write("step", last)
    except OSError:
        pass


class compute:
    """``with compute():`` times the part of a step outside collectives and marks the
    rank as having entered the step's communication when the block ends."""

    __slots__ = ("start",)

    def __enter__(self) -> compute:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        beat = _beat if _checked else _get()
        if beat is None:
            return
        beat.pending = time.perf_counter() - self.start
        try:  # noqa: SIM105 (cheaper than contextlib.suppress per step)
            beat.write("comm", beat.pending)
        except OSError:
            pass


def _reset_for_tests() -> None:
    global _beat, _checked
    if _beat is not None:
        os.close(_beat.fd)
    _beat, _checked = None, False
