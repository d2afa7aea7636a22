"""Read the files the tools are given (logs, outputs, maps, plans, baselines, snapshots)
safely: one owner for size caps, file kinds, text decoding and JSON shape errors.

Every failure is a UsageError (exit 2) naming the file: not a regular file (a directory, a
FIFO with no writer, ``/dev/zero``), larger than the cap, not UTF-8 where text is required,
not JSON, nested too deeply, or JSON of the wrong shape. ``-`` reads standard input, with
the same cap. Logs are decoded with ``errors="replace"`` (a stray byte in a 10 GB log should
not hide the NCCL lines around it); structured inputs must be UTF-8.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from typing import Any

from slurmfabric._common.textcheck import one_line
from slurmfabric.errors import UsageError

LOG_MAX_BYTES = 4 << 30  # an NCCL log or nccl-tests output; read in bounded lines
DATA_MAX_BYTES = 64 << 20  # plans, baselines, maps, snapshots
RESULT_MAX_BYTES = 256 << 20  # one job step's output in a results directory (kept in memory)


def _open(path: str, what: str):
    if path == "-":
        return sys.stdin.buffer
    try:
        info = os.stat(path)
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):  # checked before open: opening a device can act
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise UsageError(f"{what} {path}: {kind}", f"pass the {what} as a regular file")
    try:  # O_NONBLOCK and fstat: a path swapped for a FIFO after the stat cannot block us
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"{what} {path}: not a regular file", f"pass the {what} as a "
                         "regular file")
    return os.fdopen(fd, "rb")


def read_bytes(path: str, what: str, max_bytes: int = DATA_MAX_BYTES) -> bytes:
    handle = _open(path, what)
    try:
        raw = handle.read(max_bytes + 1)
    finally:
        if handle is not sys.stdin.buffer:
            handle.close()
    if len(raw) > max_bytes:
        raise UsageError(f"{what} {path}: larger than {max_bytes} bytes")
    return raw


def read_text(path: str, what: str, max_bytes: int = DATA_MAX_BYTES, *,
              lenient: bool = False) -> str:
    """The file as text; ``lenient`` replaces undecodable bytes (logs), else they are an
    error naming the offset."""
    raw = read_bytes(path, what, max_bytes)
    try:
        return raw.decode("utf-8", "replace" if lenient else "strict")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
                         f"{exc.start})") from None


def iter_log_lines(path: str, what: str, max_line: int = 1 << 16,
                   max_bytes: int = LOG_MAX_BYTES) -> Iterator[str]:
    """A log's lines, one at a time (constant memory for a 1 GB log), each cut at
    ``max_line`` characters: NCCL and nccl-tests lines are short, and a 20 MB line of noise
    must not make a parser quadratic. Undecodable bytes are replaced."""
    handle = _open(path, what)
    total = 0
    try:
        while True:
            line = handle.readline(max_line + 1)
            if not line:
                return
            total += len(line)
            if len(line) > max_line and not line.endswith(b"\n"):
                while True:  # skip the rest of the over-long line without keeping it
                    rest = handle.readline(1 << 20)
                    total += len(rest)
                    if not rest or rest.endswith(b"\n") or total > max_bytes:
                        break
                line = line[:max_line] + b"\n"
            if total > max_bytes:
                raise UsageError(f"{what} {path}: larger than {max_bytes} bytes")
            yield line.decode("utf-8", "replace")
    finally:
        if handle is not sys.stdin.buffer:
            handle.close()


def read_log_lines(path: str, what: str, max_line: int = 1 << 16,
                   max_bytes: int = LOG_MAX_BYTES) -> str:
    """The same lines as one text (for parsers that want the whole output)."""
    return "".join(iter_log_lines(path, what, max_line, max_bytes))


def read_result(path: str, what: str, max_bytes: int = RESULT_MAX_BYTES) -> str | None:
    """A file a job step wrote into a results directory, or None when there is none (the
    step never ran). Anything else is read like every input: a regular file after following
    links (a link to ``/dev/zero`` or a FIFO in the directory is an error naming it), at most
    ``max_bytes``, lines cut as in ``iter_log_lines``, undecodable bytes replaced."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        pass  # _open names the error
    return read_log_lines(path, what, max_bytes=max_bytes)


def read_json(path: str, what: str, max_bytes: int = DATA_MAX_BYTES) -> Any:
    import json

    text = read_text(path, what, max_bytes)
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(f"{what} {path}: nested too deeply") from None
    except ValueError as exc:
        raise UsageError(f"{what} {path}: not valid JSON: {one_line(str(exc))}") from None


def shape_error(path: str, what: str, error: BaseException, expected: str) -> UsageError:
    """A one-line error for JSON of the wrong shape (a KeyError/TypeError while reading)."""
    detail = one_line(f"{type(error).__name__}: {error}", 160)
    return UsageError(f"{what} {path}: not {expected} ({detail})",
                      f"use a file written by slurmfabric ({expected})")
