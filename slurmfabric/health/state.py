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
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write via a unique temporary file in the same directory, then rename over ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """The file's JSON, or None when it is missing or unreadable (never half-written)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def safe_name(text: str) -> str:
    """A file-name component from environment values (node, job id): never a path.

    The hooks run as root; whatever the environment says, it must not steer a write
    outside the state directory (no ``/``, no leading ``.``).
    """
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in text)
    return safe.lstrip(".") or "_"


def job_file(state_dir: str | os.PathLike[str], node: str, job_id: str) -> Path:
    """Per-job, per-node snapshot (RDMA counters at prolog time) for the epilog."""
    return Path(state_dir) / "jobs" / f"{safe_name(f'{node}-{job_id}')}.json"
