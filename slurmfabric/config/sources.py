"""Config sources other than pydantic-settings' own (init kwargs, environment).

``--set key=value`` strings become a nested dict; TOML files are read with errors that name
the file. The files (or in-memory tables) for one ``load_config`` call, and whether the
``SLURMFABRIC_*`` environment takes part, are handed to ``JobConfig`` through context
variables, so concurrent loads (threads, tests) never see each other's sources. The
environment is off unless a caller turns it on: a generator that imports slurmfabric must
not pick up variables it never meant for it (the CLI turns it on).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from slurmfabric.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

_FILES: ContextVar[tuple[Path | dict[str, Any], ...]] = ContextVar(
    "slurmfabric_config_files", default=())
_ENVIRONMENT: ContextVar[bool] = ContextVar("slurmfabric_config_environment", default=False)


def read_toml(path: Path) -> dict[str, Any]:
    """One TOML file as a dict; a missing or malformed file is a ConfigError naming it."""
    from slurmfabric._common.tomlfile import read_toml_file

    return read_toml_file(path)


class TomlFileSource(PydanticBaseSettingsSource):
    """A TOML file (the user's ``-c job.toml`` or the site defaults)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole file

    def __call__(self) -> dict[str, Any]:
        return read_toml(self.path)


class DictSource(PydanticBaseSettingsSource):
    """A config table given in memory (``load_config(data=...)``), at a file's place."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole table

    def __call__(self) -> dict[str, Any]:
        return self.data


# Dict fields whose keys are environment variable names: their case matters.
_CASED_DICTS = (("program", "env"), ("program", "env_prepend"), ("program", "env_append"),
                ("program", "env_expand"), ("program", "params"), ("fabric", "nccl"))


class EnvSource(EnvSettingsSource):
    """SLURMFABRIC_* variables, nested with ``__`` (``SLURMFABRIC_JOB__NODES=2``).

    Section and field names are case-insensitive, but pydantic-settings also lowercases
    dict keys, which would turn ``SLURMFABRIC_PROGRAM__ENV__OMP_NUM_THREADS`` into
    ``omp_num_threads``; the original spelling is restored from the environment.
    """

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        """List, tuple and table fields take JSON or a TOML value (``[20000, 29999]``)."""
        import json

        try:
            return json.loads(value)
        except (ValueError, TypeError):
            pass
        try:
            return tomllib.loads(f"v = {value}")["v"]
        except (ValueError, TypeError, RecursionError):
            self._bad = (field_name, value)
            raise ValueError(f"{field_name}: not JSON or a TOML value") from None

    def __call__(self) -> dict[str, Any]:
        from pydantic_settings import SettingsError

        self._bad: tuple[str, Any] | None = None
        try:
            data = super().__call__()
        except SettingsError as exc:
            raise ConfigError([self._problem(exc)]) from None
        for section, field in _CASED_DICTS:
            values = data.get(section, {}).get(field) if isinstance(data.get(section), dict) \
                else None
            if not isinstance(values, dict):
                continue
            prefix = f"{self.env_prefix}{section}__{field}__".lower()
            spelled = {name.lower()[len(prefix):]: name[len(prefix):]
                       for name in os.environ if name.lower().startswith(prefix)}
            data[section][field] = {spelled.get(k, k): v for k, v in values.items()}
        return data


    def _problem(self, exc: Exception) -> str:
        """Name the variable that could not be decoded, and the form it takes."""
        field, value = self._bad or ("", None)
        names = [name for name, text in os.environ.items()
                 if name.upper().startswith(self.env_prefix.upper())
                 and (not field or name.lower().endswith(field.lower()))
                 and (value is None or text == value)]
        name = names[0] if names else f"{self.env_prefix}*"
        shown = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(value))[:80]
        return (f"{name}: {shown!r} is not a list or table value; accepted: JSON or a TOML "
                f"value, e.g. {name}='[20000, 29999]' or '[\"a\", \"b\"]' or "
                "'{\"KEY\" = \"value\"}'" if value is not None else
                f"{name}: {' '.join(str(exc).split())}")


@contextmanager
def file_sources(paths: Sequence[Path | dict[str, Any]],
                 environment: bool = False) -> Iterator[None]:
    """Make ``paths`` (TOML files or in-memory tables, highest precedence first) the file
    sources of JobConfig inside, and the SLURMFABRIC_* environment one when asked."""
    for item in paths:
        if not isinstance(item, (Path, dict)):
            raise ConfigError([f"config: got {type(item).__name__}; accepted: a table (dict) "
                               "shaped like the TOML file, e.g. {'job': {'nodes': 2}}"])
    token, env_token = _FILES.set(tuple(paths)), _ENVIRONMENT.set(environment)
    try:
        yield
    finally:
        _FILES.reset(token)
        _ENVIRONMENT.reset(env_token)


def environment_active() -> bool:
    """Whether the SLURMFABRIC_* environment is a source of the config being built."""
    return _ENVIRONMENT.get()


def active_file_sources(settings_cls: type[BaseSettings]) -> list[PydanticBaseSettingsSource]:
    return [DictSource(settings_cls, item) if isinstance(item, dict)
            else TomlFileSource(settings_cls, item) for item in _FILES.get()]


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``["job.nodes=2", "program.command=[\\"python\\", \\"x.py\\"]"]`` -> nested dict.

    A value starting with ``[`` or ``{`` is read as a TOML inline value (lists, tables);
    anything else stays a string and pydantic converts it (``"2"`` -> 2, ``"true"`` -> True),
    so a job name like ``123`` is not turned into a number first.
    """
    result: dict[str, Any] = {}
    problems: list[str] = []
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.strip(" ").split(".")  # only spaces: a control character is refused
        if not sep or not all(parts):
            problems.append(f"--set {item!r}: expected KEY=VALUE with a dotted key, "
                            "e.g. job.nodes=2")
            continue
        value: Any = raw
        if raw.lstrip().startswith(("[", "{")):
            try:
                value = tomllib.loads(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError as exc:
                problems.append(f"--set {key}: value {raw!r} is not a TOML list or table: {exc}")
                continue
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"--set {key}: {part} was already set to a plain value")
                break
            node = child
        else:
            node[parts[-1]] = value
    if problems:
        raise ConfigError(problems)
    return result
