"""The job's restart record: one JSON line per event in ``<checkpoint dir>/.slurmfabric``.

Written by the supervisor in the batch shell (``start``, ``end``) and by the program's
checkpoint helper (``first_step``, and ``progress.json`` for the last step reached), read
by ``slurmfabric submit --wait`` and ``slurmfabric resume history`` to say what each restart
cost. A file next to the checkpoints, not Slurm's accounting: clusters without slurmdbd
keep the history too (https://github.com/pytorch/torchx/issues/1070). Standard library only.
"""

from __future__ import annotations

import json
import os

from slurmfabric._common.files import write_atomic

STATE = ".slurmfabric"
EVENTS = "events.jsonl"
PROGRESS = "progress.json"
MAX_LINE = 64 * 1024  # a longer line is not ours: skipped when reading


def state_dir(directory: str) -> str:
    return os.path.join(directory, STATE)


def append(directory: str, record: dict[str, object]) -> None:
    """One JSON line; a single O_APPEND write(2) of one line does not interleave with
    another writer's line."""
    os.makedirs(state_dir(directory), exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(os.path.join(state_dir(directory), EVENTS),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(directory: str, run: str | None = None) -> list[dict[str, object]]:
    """Every well-formed event (of one ``run`` when given), in the order written."""
    try:
        with open(os.path.join(state_dir(directory), EVENTS), "rb") as handle:
            raw = handle.read(64 * 1024 * 1024)
    except OSError:
        return []
    out = []
    for line in raw.splitlines():
        if len(line) > MAX_LINE:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and (run is None or record.get("run") == run):
            out.append(record)
    return out


def write_progress(directory: str, record: dict[str, object]) -> None:
    """The last step reached, replaced atomically (rename(2))."""
    write_atomic(os.path.join(state_dir(directory), PROGRESS), json.dumps(record))


def read_progress(directory: str) -> dict[str, object] | None:
    try:
        with open(os.path.join(state_dir(directory), PROGRESS)) as handle:
            record = json.loads(handle.read(MAX_LINE))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
