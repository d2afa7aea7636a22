"""Files every part writes or reads back: one atomic writer, the lenient JSON reader of
state files, and file-name components from untrusted values.

Standard library only, and json imported on use: the TaskProlog and the hooks import this
on every task and every job start.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any


def write_atomic(path: str | os.PathLike[str], data: str | bytes, mode: int | None = None) -> None:
    """Write a unique temporary file beside ``path``, then rename it over ``path``.

    rename(2) replaces the target atomically within one file system: a reader (slurmstepd,
    a concurrent task, the epilog) sees the old file or the new one, never half of one, and
    a failure leaves the old one in place. ``mode`` sets the permission bits before the
    rename, so the file is never visible with the wrong ones.
    """
    target = os.fspath(path)
    parent = os.path.dirname(target) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(target)}.{os.getpid()}."
                               f"{time.monotonic_ns()}.tmp")
    try:
        with open(tmp, "wb" if isinstance(data, bytes) else "w",
                  **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as handle:
            handle.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    import json

    write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")


def read_json_or_none(path: str | os.PathLike[str]) -> Any:
    """A state file's JSON, or None when it is missing or unreadable. For files this
    project wrote itself (atomically); user input goes through ``inputfile.read_json``,
    which names the file and the fault instead."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError, RecursionError):  # RecursionError: nesting past the limit
        return None


def safe_name(text: str) -> str:
    """A file-name component from environment values (node, job id): never a path.

    The hooks run as root; whatever the environment says, it must not steer a write
    outside the state directory (no ``/``, no leading ``.``).
    """
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in text)
    return safe.lstrip(".") or "_"
