"""PyTorch's NCCL flight recorder dumps: read them without running them.

With ``TORCH_FR_BUFFER_SIZE`` (torch <= 2.7: ``TORCH_NCCL_TRACE_BUFFER_SIZE``) > 0 and
``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, ProcessGroupNCCL keeps a ring buffer of its last
collectives and, when its watchdog times out, each rank writes it to
``<TORCH_FR_DUMP_TEMP_FILE><rank>`` (torch <= 2.7: ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``;
default ``/tmp/nccl_trace_rank_``; the names: rank/torchnames.py). https://pytorch.org/docs/stable/torch_nccl_environment_variables.html
The file is a pickle of a dict: ``version``, ``pg_config``, ``entries`` (each:
``process_group`` (name, desc), ``collective_seq_id``, ``profiling_name`` such as
``nccl:all_reduce``, ``state`` scheduled|started|completed, ``frames``), as read by
PyTorch's own analyser (torch/distributed/flight_recorder/components/loader.py and
types.py, torch 2.13).

A pickle is a program: unpickling runs whatever callables it names. ``load`` uses an
Unpickler that refuses every global (the dump is plain dicts, lists, tuples, strings and
numbers, which pickle encodes without globals), so a crafted file raises instead of
running code. Standard library only: the collector runs this on each node.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

from slurmfabric.rank.torchnames import RENAMED

PREFIX_ENV = ("TORCH_FR_DUMP_TEMP_FILE", RENAMED["TORCH_FR_DUMP_TEMP_FILE"])
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
MAX_BYTES = 256 * 1024 * 1024


class RefusedPickle(ValueError):
    """The dump names a global (a callable): not a flight recorder dump; not run."""


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickle(f"the dump names {module}.{name}: refused (data only)")


def load(path: str) -> dict[str, Any]:
    """One rank's dump as plain data; RefusedPickle for anything that is not."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path}: over {MAX_BYTES} bytes")
    value = _DataOnly(io.BytesIO(data)).load()
    if not isinstance(value, dict) or "entries" not in value:
        raise ValueError(f"{path}: not a flight recorder dump (no 'entries')")
    return value


def dump_files(prefix: str) -> dict[int, str]:
    """rank -> path of the dumps written under ``prefix`` (``<prefix><rank>``)."""
    directory, stem = os.path.split(prefix)
    found: dict[int, str] = {}
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return found
    for name in names:
        rest = name[len(stem):]
        if name.startswith(stem) and rest.isdigit():
            found[int(rest)] = os.path.join(directory, name)
    return found


def summarise(dump: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per process group: the highest sequence id enqueued, started and completed, and the
    name and innermost frame of the last one enqueued: what ``diagnose`` compares across
    ranks."""
    groups: dict[str, dict[str, Any]] = {}
    for entry in dump.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        pg = entry.get("process_group")
        name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(entry.get("pg_id"))
        seq = entry.get("collective_seq_id")
        if not isinstance(seq, int):
            continue
        group = groups.setdefault(name, {"last_enqueued": -1, "last_started": -1,
                                         "last_completed": -1, "op": "", "frame": ""})
        state = entry.get("state")
        if seq > group["last_enqueued"]:
            frames = entry.get("frames") or []
            top = frames[0] if frames and isinstance(frames[0], dict) else {}
            group.update(last_enqueued=seq, op=str(entry.get("profiling_name", "")),
                         frame=(f"{top.get('name', '?')} at {top.get('filename', '?')}:"
                                f"{top.get('line', '?')}") if top else "")
        if state in ("started", "completed"):
            group["last_started"] = max(group["last_started"], seq)
        if state == "completed":
            group["last_completed"] = max(group["last_completed"], seq)
    return groups


def collect(prefix: str) -> dict[int, dict[str, Any]]:
    """rank -> summary (or ``{"error": ...}``) of every dump under ``prefix``."""
    out: dict[int, dict[str, Any]] = {}
    for rank, path in sorted(dump_files(prefix).items()):
        try:
            out[rank] = {"path": path, "groups": summarise(load(path))}
        except (OSError, ValueError, pickle.UnpicklingError, EOFError) as error:
            out[rank] = {"path": path, "error": str(error)}
    return out


def prefixes_from_env(env: dict[str, str]) -> list[str]:
    """Where a rank with ``env`` writes its dump: under either name (a torch >= 2.8 reads
    the new one, an older torch the old one, and they may differ), else PyTorch's default."""
    found = [env[name] for name in PREFIX_ENV if env.get(name)]
    return list(dict.fromkeys(found)) or [DEFAULT_PREFIX]
