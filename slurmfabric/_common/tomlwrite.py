"""Write a config dict as TOML (the standard library reads TOML but does not write it).

Only what configs hold: tables of strings, integers, booleans, lists of those, nested tables
and arrays of tables. Strings are TOML basic strings with every character TOML requires
escaped (TOML 1.0, "String": backslash, quote, and control characters), so any text
round-trips through ``tomllib`` unchanged.
"""

from __future__ import annotations

import re
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def key(name: str) -> str:
    return name if _BARE_KEY.match(name) else string(name)


def value(item: Any) -> str:
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, (list, tuple)):
        words = [value(v) for v in item]
        one_line = "[" + ", ".join(words) + "]"
        if len(one_line) <= 88 and "\n" not in one_line:
            return one_line
        return "[\n" + "".join(f"    {w},\n" for w in words) + "]"
    if isinstance(item, dict):
        return "{" + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + "}"
    raise TypeError(f"cannot write {type(item).__name__} as TOML")


def _is_table(item: Any) -> bool:
    return isinstance(item, dict)


def _is_table_array(item: Any) -> bool:
    return isinstance(item, list) and bool(item) and all(isinstance(v, dict) for v in item)


def dumps(data: dict[str, Any]) -> str:
    """TOML text for ``data``; plain values first in each table, then its sub-tables."""
    lines: list[str] = []
    _table(data, [], lines)
    return "\n".join(lines).strip("\n") + "\n"


def _table(data: dict[str, Any], path: list[str], lines: list[str]) -> None:
    plain = {k: v for k, v in data.items() if not _is_table(v) and not _is_table_array(v)}
    for name, item in plain.items():
        lines.append(f"{key(name)} = {value(item)}")
    for name, item in data.items():
        if _is_table(item):
            sub = path + [name]
            lines += ["", "[" + ".".join(key(p) for p in sub) + "]"]
            _table(item, sub, lines)
        elif _is_table_array(item):
            for entry in item:
                sub = path + [name]
                lines += ["", "[[" + ".".join(key(p) for p in sub) + "]]"]
                _table(entry, sub, lines)
