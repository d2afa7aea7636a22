"""Records of any size through srun's output: short numbered lines, put back together.

srun passes a task's output on in pieces of at most 1024 bytes, each piece its own line
under ``--label`` (a 3 KiB JSON line arrives as three labelled lines, none of which
parses). A record therefore travels as lines of at most ``CHUNK`` characters, each
``@sf1 <id> <i>/<n> <piece>``: ``id`` tells one record from another of the same task,
``i``/``n`` put the pieces in order and say when it is complete. The label (``N: ``) that
srun adds keeps the tasks apart; a record with a piece missing is dropped whole, never
half read. JSON text from ``json.dumps`` is ASCII, so a piece is never cut inside a
character. Standard library only (the collector runs on every node).
"""

from __future__ import annotations

import itertools
import os

MARK = "@sf1"
CHUNK = 512  # far below srun's 1024-byte pieces, label and header included
_ids = itertools.count()


def frame(text: str) -> list[str]:
    """The lines that carry ``text`` (one line of ASCII, no newline)."""
    rid = f"{os.getpid()}.{next(_ids)}"
    pieces = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    return [f"{MARK} {rid} {i}/{len(pieces)} {piece}" for i, piece in enumerate(pieces, 1)]


def unlabel(line: str) -> tuple[str, str]:
    """(label, rest) of a line srun printed with ``--label`` (``"12: text"``); label ""
    when the line has none."""
    head, sep, rest = line.partition(": ")
    return (head.strip(), rest) if sep and head.strip().isdigit() else ("", line)


def reassemble(text: str) -> tuple[list[str], list[str]]:
    """(records, other lines): every complete framed record in order of its last piece,
    and the lines that are not pieces (label removed)."""
    partial: dict[tuple[str, str], dict[int, str]] = {}
    done: list[str] = []
    other: list[str] = []
    for line in text.splitlines():
        label, body = unlabel(line)
        parts = body.split(" ", 3)
        if len(parts) < 3 or parts[0] != MARK:
            other.append(body)
            continue
        index, _, count = parts[2].partition("/")
        if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
            continue
        key = (label, parts[1])
        pieces = partial.setdefault(key, {})
        pieces[int(index)] = parts[3] if len(parts) > 3 else ""
        if len(pieces) == int(count):
            done.append("".join(pieces[i] for i in range(1, int(count) + 1)))
            del partial[key]
    return done, other
