"""The node's local state: one lock, atomic JSON files.

Several hooks can run at once on a shared node (a prolog for job A while the epilog of job B
runs). State writes happen under an exclusive ``fcntl.flock`` taken with a timeout: a hook
that cannot get the lock fails loudly (never "lock held, so pass", the bug of
``flock -n ... || exit 0`` wrappers). Every file is written to a unique temporary name and
renamed into place, so readers see the old or the new file, never half of one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from slurmfabric._common.files import safe_name
from slurmfabric.errors import HealthError


@contextlib.contextmanager
def locked(state_dir: str | os.PathLike[str], timeout: float) -> Iterator[None]:
    """Hold the state dir's lock; raise HealthError after ``timeout`` seconds of waiting."""
    directory = Path(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise HealthError(
                        f"state lock {directory / '.lock'} still held after {timeout:g} s",
                        hint="another slurmfabric hook is stuck; see its log, or raise "
                        "[runner] lock_timeout_s",
                    ) from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def job_file(state_dir: str | os.PathLike[str], node: str, job_id: str) -> Path:
    """Per-job, per-node snapshot (RDMA counters at prolog time) for the epilog."""
    return Path(state_dir) / "jobs" / f"{safe_name(f'{node}-{job_id}')}.json"
