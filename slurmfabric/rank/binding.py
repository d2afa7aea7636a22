"""Apply a RankBinding to the current process: CPU affinity and its memory node.

Runs in ``slurmfabric launch`` just before exec, so the program inherits both (affinity
and memory policy survive execve: sched_setaffinity(2), set_mempolicy(2)). Never raises
for an unsupported kernel or a missing NUMA node: it warns and carries on.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # no typing at run time: launch imports this on every rank
if TYPE_CHECKING:
    from collections.abc import Callable

# set_mempolicy(2) syscall numbers (asm/unistd.h) and policy values (linux/mempolicy.h).
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 236, "ppc64le": 261}
MPOL_PREFERRED = 1  # prefer the node, spill elsewhere instead of OOM-killing (unlike BIND)


def _stderr(message: str) -> None:
    print(f"slurmfabric: warning: {message}", file=sys.stderr)


def set_preferred_node(node: int) -> str | None:
    """set_mempolicy(MPOL_PREFERRED, {node}); returns an error text instead of raising."""
    machine = os.uname().machine  # what platform.machine() returns, without its imports
    number = _SET_MEMPOLICY.get(machine)
    if number is None:
        return f"set_mempolicy: unknown syscall number on {machine}"
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        words = node // 64 + 1
        mask = (ctypes.c_ulong * words)()
        mask[node // 64] = 1 << (node % 64)
        # maxnode counts bits; the kernel ignores the last one in some versions, so +1.
        if libc.syscall(number, MPOL_PREFERRED, mask, ctypes.c_ulong(words * 64 + 1)) != 0:
            return f"set_mempolicy(MPOL_PREFERRED, node {node}): {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as error:
        return f"set_mempolicy unavailable: {error}"
    return None


def apply_binding(binding: object, warn: Callable[[str], None] = _stderr) -> None:
    """Pin this process to ``binding.cpus`` and keep its memory on ``binding.mem_node``.

    The plan sets ``mem_node`` only when every CPU of the binding lies on that node. Once
    the affinity is set, Linux's default (local) allocation already places memory there,
    so set_mempolicy is called only when the CPU binding could not be applied. This also
    keeps a memory policy the user chose from outside (``numactl --interleave ... srun``)
    and spares every rank the ctypes import (about 5 ms of start-up).
    """
    cpus = set(getattr(binding, "cpus", ()) or ())
    pinned = False
    if cpus:
        if not hasattr(os, "sched_setaffinity"):
            warn("CPU binding skipped: os.sched_setaffinity is not available on this platform")
        else:
            try:
                os.sched_setaffinity(0, cpus)
                pinned = True
            except OSError as error:  # EINVAL: none of the CPUs is in our cgroup/cpuset
                warn(
                    f"CPU binding to {sorted(cpus)[:8]}... failed: {error}; keeping the current set"
                )
    node = getattr(binding, "mem_node", None)
    if node is not None and not pinned:
        problem = set_preferred_node(int(node))
        if problem:
            warn(f"memory binding skipped: {problem}")
