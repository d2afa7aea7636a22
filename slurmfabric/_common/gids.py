"""The walk over a port's GID slots, shared by discovery (topology/rdma.py) and the plan
cache's fingerprint (rank/plancache.py), so both read exactly the same slots.

GID tables hold 128-256 slots, one sysfs file each (kernel ABI,
Documentation/ABI/stable/sysfs-class-infiniband, ``ports/<N>/gids/<N>``). Populated slots
come first (from 0 on a host, from 4 or 6 inside a pod: NVIDIA/nccl #1573), so the walk
stops after ``EMPTY_RUN`` empty slots in a row instead of reading all of them on every rank.
Standard library only: the plan cache's check runs on every rank.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no typing import on the per-rank path (it costs milliseconds)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
EMPTY_RUN = 16
# An unreadable slot (None: EINVAL outside the container's network namespace,
# drivers/infiniband/core/sysfs.c show_port_gid_attr_ndev), an empty one, or all zeros;
# as text (discovery's reader) or as the raw bytes the fingerprint keeps.
_EMPTY = ("", ZERO_GID, b"", ZERO_GID.encode())


def walk(names: Iterable[str],
         read: Callable[[str], str | bytes | None]) -> Iterator[tuple[int, str | bytes | None]]:
    """``(index, value)`` of every slot read, in index order, empty ones included, until
    ``EMPTY_RUN`` empty slots in a row. ``names``: the ``gids`` directory's entries;
    ``read(name)``: one slot's value, None when unreadable."""
    empty_run = 0
    for index in sorted(int(name) for name in names if name.isdigit()):
        value = read(str(index))
        yield index, value
        if value is None or value.strip() in _EMPTY:
            empty_run += 1
            if empty_run >= EMPTY_RUN:
                return
        else:
            empty_run = 0
