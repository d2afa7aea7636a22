"""The slurmfabric executable that jobs and hooks should call back into.

A sweep job, a RoCE step or a Slurm hook runs ``slurmfabric ...`` again on a compute node;
it must be the same install that wrote the job, so the path is taken from the running
interpreter, not from PATH (hooks run with none)."""

from __future__ import annotations

import sys
from pathlib import Path


def this_executable() -> str:
    """The console script next to this interpreter (a venv's bin/slurmfabric), else the
    script this process was started as."""
    candidate = Path(sys.executable).parent / "slurmfabric"
    return str(candidate if candidate.exists() else Path(sys.argv[0]).resolve())
