"""Lemon nodes: a node slurmfabric drained ``lemon_drains`` times within ``lemon_window_h``.

Fleet reliability studies call a node that fails, is repaired (or simply resumed) and fails
again a "lemon": each return to service costs the next job that lands on it. Once a node
reaches the count, its drain reason says so (``slurmfabric: <check>: lemon: drained 3 times
in 24 h, ...``) and nothing of slurmfabric resumes it (``auto_resume``, ``health resume``)
until an admin clears it with ``health resume --clear-lemon``, which also resets the count.
The reason keeps the check, so the circuit breaker still groups it with its check.

The count lives in the node's state directory (``drains-<node>.json``): the hook that drains
is the one that counts, with no extra call to slurmctld. Only drains that stayed count; one
the circuit breaker undid does not. Standard library only: this runs inside the prolog.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from slurmfabric._common import files

MARK = "lemon: drained "


def _path(state_dir: str | os.PathLike[str], node: str) -> Path:
    return Path(state_dir) / f"drains-{files.safe_name(node)}.json"


def drain_times(state_dir: str | os.PathLike[str], node: str) -> list[float]:
    """Every drain of ``node`` that stayed, as Unix times (oldest first; [] when none)."""
    data = files.read_json_or_none(_path(state_dir, node))
    times = data.get("times") if isinstance(data, dict) else None
    if not isinstance(times, list):
        return []
    return sorted(float(t) for t in times if isinstance(t, (int, float)))


def recent(state_dir: str | os.PathLike[str], node: str, window_h: float,
           now: float | None = None) -> list[float]:
    """The drains within the last ``window_h`` hours."""
    now = time.time() if now is None else now
    return [t for t in drain_times(state_dir, node) if now - t <= window_h * 3600.0]


def record(state_dir: str | os.PathLike[str], node: str, when: float, window_h: float) -> None:
    """Count one drain that stayed; entries older than the window are dropped."""
    keep = [t for t in drain_times(state_dir, node) if when - t <= window_h * 3600.0]
    files.write_json(_path(state_dir, node), {"node": node, "times": keep + [when]})


def clear(state_dir: str | os.PathLike[str], node: str) -> None:
    """An admin repaired the node: forget its count."""
    with contextlib.suppress(OSError):
        _path(state_dir, node).unlink()


def detail(count: int, window_h: float, check_detail: str) -> str:
    """The reason's detail for a lemon: the count first, so it survives the 200-char cut."""
    return (f"{MARK}{count} times in {window_h:g} h, not auto-resumed "
            f"(slurmfabric health resume --clear-lemon): {check_detail}")


def is_lemon(reason: str) -> bool:
    """Does a slurmfabric reason (``slurmfabric: <check>: lemon: ...``) mark a lemon?"""
    head, _, rest = reason.partition(":")
    return head == "slurmfabric" and rest.partition(":")[2].strip().startswith(MARK)
