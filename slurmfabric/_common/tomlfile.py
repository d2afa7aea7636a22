"""Read one TOML file safely: every way a file can be wrong is a one-line ConfigError.

Shared by the job config (config/sources.py) and the health site config (which runs in
every prolog, so this module is standard library only). A config is read only if it is a
regular file (a directory, a FIFO with no writer or /dev/zero would hang or fill memory),
at most ``max_bytes`` long, valid UTF-8, and nested less deeply than the parser's stack.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

from slurmfabric._common.textcheck import one_line
from slurmfabric.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

DEFAULT_MAX_BYTES = 1 << 20


def read_toml_file(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES,
                   hint: str | None = None) -> dict[str, Any]:
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such config file"], hint=hint) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"], hint=hint) from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError([f"{path}: not a regular file"], hint=hint)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"], hint=hint) from None
    if len(raw) > max_bytes:
        raise ConfigError([f"{path}: larger than {max_bytes} bytes; not a config file"],
                          hint=hint)
    return parse_toml_text(raw, str(path))


def parse_toml_text(raw: bytes, where: str) -> dict[str, Any]:
    """TOML bytes -> dict; non-UTF-8, deep nesting and huge integers are ConfigErrors."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{where}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
                           f"{exc.start})"], hint="TOML files are UTF-8") from None
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise ConfigError([f"{where}: nested too deeply to be a config"]) from None
    except ValueError as exc:  # TOMLDecodeError, and integers past Python's digit limit
        raise ConfigError([f"{where}: not valid TOML: {one_line(str(exc))}"]) from None
