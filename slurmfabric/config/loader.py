"""``load_config``: merge the sources in one fixed order and turn pydantic's errors into
one line per problem that names the field and what is accepted."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import BaseModel, ValidationError

from slurmfabric.config.models import JobConfig
from slurmfabric.config.sources import file_sources, parse_set
from slurmfabric.errors import ConfigError

SITE_DEFAULTS = Path("/etc/slurmfabric/defaults.toml")
SITE_DEFAULTS_ENV = "SLURMFABRIC_SITE_DEFAULTS"

PathLike = Union[str, "os.PathLike[str]"]


def site_defaults_path(explicit: Optional[PathLike] = None) -> Optional[Path]:
    """The site defaults file: ``--site-defaults``, else $SLURMFABRIC_SITE_DEFAULTS, else
    /etc/slurmfabric/defaults.toml when it exists. A file named explicitly must exist;
    an empty value switches site defaults off."""
    if explicit is not None:
        return Path(explicit) if str(explicit) else None
    from_env = os.environ.get(SITE_DEFAULTS_ENV)
    if from_env is not None:
        return Path(from_env) if from_env else None
    return SITE_DEFAULTS if SITE_DEFAULTS.is_file() else None


def load_config(
    path: Optional[PathLike] = None,
    sets: Sequence[str] = (),
    site_defaults: Optional[PathLike] = None,
) -> JobConfig:
    """Build a JobConfig. Highest first: ``sets`` (``key=value``), SLURMFABRIC_* environment
    (``SLURMFABRIC_JOB__NODES=2``), the TOML file ``path``, the site defaults, defaults.

    Raises ConfigError with one line per problem (the CLI exits 2 with them).
    """
    overrides = parse_set(sets)
    files = [Path(p) for p in (path, site_defaults_path(site_defaults)) if p is not None]
    try:
        with file_sources(files):
            return JobConfig(**overrides)
    except ValidationError as exc:
        raise ConfigError(
            format_errors(exc),
            hint="fix the fields named above; examples/*.toml are complete configs",
        ) from None


def _dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc) or "config"


def _model_at(loc: Sequence[Any]) -> Optional[type[BaseModel]]:
    """The model class whose field list applies at ``loc`` (for 'accepted fields')."""
    model: Any = JobConfig
    for part in loc:
        field = getattr(model, "model_fields", {}).get(str(part))
        if field is None:
            return None
        model = field.annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _from_env(loc: Sequence[Any], got: Any) -> str:
    """`` (from $SLURMFABRIC_X__Y)`` when that variable supplied the bad value."""
    wanted = ("SLURMFABRIC_" + "__".join(str(p) for p in loc)).upper()
    for name, value in os.environ.items():
        if name.upper() == wanted and value == str(got):
            return f" (from ${name})"
    return ""


def format_errors(exc: ValidationError) -> list[str]:
    """One line per problem: ``<field>: <what is wrong>; accepted: <what is>``."""
    lines: list[str] = []
    for error in exc.errors():
        before = len(lines)
        _format_one(error, lines)
        if len(lines) == before + 1 and error["loc"]:
            lines[-1] += _from_env(error["loc"], error.get("input"))
    return lines


_BOUNDS = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">",
           "less_than": "<"}


def _format_one(error: Any, lines: list[str]) -> None:
    loc, kind, ctx = error["loc"], error["type"], error.get("ctx") or {}
    got = error.get("input")
    where = _dotted(loc)
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        accepted = ", ".join(model.model_fields) if model else "see the docs"
        lines.append(f"{where}: unknown field; accepted fields here: {accepted}")
    elif kind == "value_error":
        message = str(ctx.get("error", error["msg"]))
        prefix = f"{where}: " if loc else ""
        lines.extend(prefix + line for line in message.splitlines())
    elif kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
        lines.append(f"{where}: got {got!r}; accepted: {expected}")
    elif kind in _BOUNDS:
        limit = next(iter(ctx.values()), "?")
        lines.append(f"{where}: got {got!r}; accepted: a number {_BOUNDS[kind]} {limit}")
    elif kind in ("int_parsing", "int_type", "int_from_float"):
        lines.append(f"{where}: got {got!r}; accepted: an integer")
    elif kind in ("bool_parsing", "bool_type"):
        lines.append(f"{where}: got {got!r}; accepted: true or false")
    else:
        lines.append(f"{where}: {error['msg']} (got {got!r})")
