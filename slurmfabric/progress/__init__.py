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
the compute part themselves.

The data-loading share: the time from the end of one step (``step()``) to the start of
the next one's compute (``compute()`` entered) is the time the loop waited for its next
batch (the ``for batch in loader`` between them calls the DataLoader's ``__next__``), so
a program that uses ``compute()`` reports it with no change. ``timed(loader)`` measures
the ``__next__`` calls themselves (for loops that fetch inside the compute block, or do
more between the two), and ``step(data_seconds=...)`` takes the program's own figure.
Each beat carries the running sums of the data wait and of the steps' wall time it was
measured over; the share is their ratio. The first step is not counted (no step before
it: its wait includes the loader's start).

The record is JSON padded with spaces to ``RECORD`` bytes: a reader that catches a write
half done sees two consecutive beats of one rank mixed, or text that does not parse
(skipped until the next read). The supervisor reads every rank's beats from the batch
shell's node, so a rendered job puts the directory under its checkpoint directory, which
every node shares (docs/progress.md: NFS delays the beats by its caches, keep the hang
timeout above them); ``collect`` reads the beats on each node.

Standard library only, imported by every rank: nothing here may import more.
"""

from __future__ import annotations

import os
import time

__all__ = ["ENV", "RECORD", "compute", "enabled", "step", "timed"]

ENV = "SLURMFABRIC_PROGRESS_DIR"
RECORD = 512  # bytes per beat; the reader accepts any length up to 4 KiB


class _Beat:
    """One rank's heartbeat file and running totals."""

    __slots__ = ("fd", "head", "step", "compute_sum", "timed", "pending", "data_sum",
                 "wall_sum", "data_timed", "data_pending", "last_end", "loader")

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
        self.data_sum = 0.0  # data wait of the counted steps
        self.wall_sum = 0.0  # their wall time, step() to step()
        self.data_timed = 0
        self.data_pending: float | None = None  # this step's data wait so far
        self.last_end: float | None = None  # perf_counter() at the last step()
        self.loader = False  # a timed() loader measures the wait: compute() does not

    def write(self, phase: str, last: float | None) -> None:
        text = (f'{self.head}"step":{self.step},"phase":"{phase}","time":{time.time():.6f},'
                f'"compute":{"null" if last is None else f"{last:.6f}"},'
                f'"compute_sum":{self.compute_sum:.6f},"timed":{self.timed},'
                f'"data_sum":{self.data_sum:.6f},"wall_sum":{self.wall_sum:.6f},'
                f'"data_timed":{self.data_timed}}}')
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


def step(compute_seconds: float | None = None, step: int | None = None,
         data_seconds: float | None = None) -> None:
    """One step done. ``compute_seconds``: this step's time outside collectives (else
    what ``compute()`` measured, if it was used); ``step``: the program's own step
    number (a resumed job starts past 0), else one more than the last;
    ``data_seconds``: this step's wait for its input (else what ``timed()`` or the gap
    before ``compute()`` measured)."""
    beat = _beat if _checked else _get()
    if beat is None:
        return
    now = time.perf_counter()
    data = data_seconds if data_seconds is not None else beat.data_pending
    beat.data_pending = None
    if data is not None and beat.last_end is not None:
        beat.data_sum += data
        beat.wall_sum += now - beat.last_end
        beat.data_timed += 1
    beat.last_end = now
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
        if beat.data_pending is None and beat.last_end is not None and not beat.loader:
            beat.data_pending = max(0.0, self.start - beat.last_end)  # the gap: the wait
        try:  # noqa: SIM105 (cheaper than contextlib.suppress per step)
            beat.write("comm", beat.pending)
        except OSError:
            pass


class timed:
    """``for batch in progress.timed(loader):`` the loader, with the time of each
    ``__next__`` added to the current step's data wait (what ``step()`` reports)."""

    __slots__ = ("iterable",)

    def __init__(self, iterable: object) -> None:
        self.iterable = iterable

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __iter__(self):
        beat = _beat if _checked else _get()
        items = iter(self.iterable)  # type: ignore[call-overload]
        if beat is None:
            yield from items
            return
        beat.loader = True
        clock = time.perf_counter
        while True:
            start = clock()
            try:
                item = next(items)
            except StopIteration:
                return
            beat.data_pending = (beat.data_pending or 0.0) + clock() - start
            yield item


def _reset_for_tests() -> None:
    global _beat, _checked
    if _beat is not None:
        os.close(_beat.fd)
    _beat, _checked = None, False
