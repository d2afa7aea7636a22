"""The examples of README.md and docs/*.md as data, so tests can run each one and compare
what it prints.

A fenced ``console`` block holds commands (``$ `` lines, ``\\`` continues them) each followed
by the output it prints. A ``bash`` block holds commands only. A trailing comment after two
spaces (``cmd   # why``) is prose, not part of the command. In shown output, a line that is
only ``...`` stands for any number of lines, and ``...`` inside a line for any text; every
other line must be printed exactly, in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
_COMMENT = re.compile(r"\s{2,}#.*$")




def pages() -> list[str]:
    """The pages whose examples are tested, relative to the repository root."""
    return ["README.md", *(f"docs/{path.name}" for path in sorted(DOCS.glob("*.md")))]


@dataclass
class Example:
    line: int  # the page's line of the command's first line
    lang: str
    command: str  # continuation lines joined by one space, prose comments removed
    output: list[str] = field(default_factory=list)  # shown output (console blocks)
    page: str = "README.md"  # relative to the repository root


def blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """Every fenced block: (first line of its body, its language, its lines)."""
    blocks, current, start, lang = [], None, 0, ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current, start, lang = [], number + 1, line[3:].strip()
            else:
                blocks.append((start, lang, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _join(lines: list[str]) -> str:
    parts = [_COMMENT.sub("", line).rstrip().removesuffix("\\").strip() for line in lines]
    return " ".join(part for part in parts if part)


def examples(text: str | None = None, page: str = "README.md") -> list[Example]:
    """Every command in a console or bash block of page (or text) that runs ``slurmfabric``."""
    text = (ROOT / page).read_text() if text is None else text
    found: list[Example] = []
    for start, lang, lines in blocks(text):
        if lang not in ("console", "bash"):
            continue
        i = 0
        while i < len(lines):
            line = lines[i]
            is_command = line.startswith("$ ") if lang == "console" else (
                line.strip() and not line.lstrip().startswith("#"))
            if not is_command:
                i += 1
                continue
            first, chunk = start + i, [line.removeprefix("$ ")]
            while _COMMENT.sub("", chunk[-1]).rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                chunk.append(lines[i])
            i += 1
            output: list[str] = []
            while lang == "console" and i < len(lines) and not lines[i].startswith("$ "):
                output.append(lines[i].rstrip())
                i += 1
            command = _join(chunk)
            if "slurmfabric" in command:
                found.append(Example(first, lang, command, output, page))
    return found


def all_examples() -> list[Example]:
    """The examples of every page: README.md, then docs/*.md."""
    return [example for page in pages() for example in examples(page=page)]


def block_after(marker: str, text: str | None = None, page: str = "README.md") -> list[str]:
    """The lines of the first fenced block that follows the prose line containing marker."""
    text = (ROOT / page).read_text() if text is None else text
    at = text.index(marker)
    for start, _lang, lines in blocks(text):
        if text.count("\n", 0, at) + 1 < start:
            return [line.rstrip() for line in lines]
    raise ValueError(f"no block after {marker!r}")


def block_with(needle: str, page: str, lang: str | None = None) -> str:
    """The one fenced block of page (of language lang) whose text contains needle."""
    found = ["\n".join(lines) + "\n" for _start, kind, lines in blocks((ROOT / page).read_text())
             if needle in "\n".join(lines) and lang in (None, kind)]
    if len(found) != 1:
        raise ValueError(f"{page}: {len(found)} blocks contain {needle!r}, not 1")
    return found[0]


def _line_matches(pattern: str, line: str) -> bool:
    if "..." not in pattern:
        return pattern == line
    pieces = [re.escape(piece) for piece in pattern.split("...")]
    return re.fullmatch(".*".join(pieces), line) is not None


def mismatch(shown: list[str], printed: list[str]) -> str | None:
    """None when printed output is what the page shows, else the first line that differs."""

    def walk(s: int, p: int) -> bool:
        while s < len(shown):
            if shown[s].strip() == "...":
                return any(walk(s + 1, q) for q in range(p, len(printed) + 1))
            if p >= len(printed) or not _line_matches(shown[s], printed[p]):
                return False
            s, p = s + 1, p + 1
        return p == len(printed)

    if walk(0, 0):
        return None
    for line in shown:
        if line.strip() != "..." and not any(_line_matches(line, out) for out in printed):
            return f"shown line {line!r} is not printed"
    return "README lines appear, but not in the order or with the gaps shown:\n" + "\n".join(
        printed)
