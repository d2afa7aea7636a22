"""The slurmfabric executable that jobs and hooks should call back into.

A sweep job, a RoCE step or a Slurm hook runs ``slurmfabric ...`` again on a compute node;
it must be the same install that wrote the job, so the path is taken from the running
interpreter, not from PATH (hooks run with none)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def this_executable() -> str:
    """The console script next to this interpreter (a venv's bin/slurmfabric), else the
    script this process was started as."""
    candidate = Path(sys.executable).parent / "slurmfabric"
    return str(candidate if candidate.exists() else Path(sys.argv[0]).resolve())


def probe(flag: str, path: str, args: list[str], no_path: str, missing: str) -> Any:
    """Run ``path args`` the way a hook will (an absolute path, an executable file, no stdin,
    a deadline) and return the CompletedProcess; anything that stops it from running is a
    UsageError naming ``flag``. The caller judges what it printed."""
    import os
    import subprocess

    from slurmfabric.errors import UsageError

    if not os.path.isabs(path):
        raise UsageError(f"{flag} {path!r} must be an absolute path", hint=no_path)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise UsageError(f"{flag} {path}: no such executable file", hint=missing)
    try:
        return subprocess.run([path, *args], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"{flag} {path}: does not run: {exc}") from None
