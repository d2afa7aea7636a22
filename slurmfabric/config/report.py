"""pydantic's validation errors as one line per problem that names the field and what is
accepted: the same lines for a TOML file, a ``--set``, an environment variable or an
in-memory table (``JobConfig(**table)``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

CONFIG_HINT = "fix the fields named above; examples/*.toml are complete configs"


def _dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc) or "config"


def _model_at(root: type[BaseModel], loc: Sequence[Any]) -> Optional[type[BaseModel]]:
    """The model class whose field list applies at ``loc`` (for 'accepted fields')."""
    model: Any = root
    for part in loc:
        field = getattr(model, "model_fields", {}).get(str(part))
        if field is None:
            return None
        model = field.annotation
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _from_env(loc: Sequence[Any], got: Any) -> str:
    """`` (from $SLURMFABRIC_X__Y)`` when that variable supplied the bad value."""
    from slurmfabric.config.sources import environment_active

    if not environment_active():
        return ""
    wanted = ("SLURMFABRIC_" + "__".join(str(p) for p in loc)).upper()
    for name, value in os.environ.items():
        if name.upper() == wanted and value == str(got):
            return f" (from ${name})"
    return ""


def format_errors(exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """One line per problem: ``<field>: <what is wrong>; accepted: <what is>``; ``root`` is
    the model validated (its fields are listed for an unknown one)."""
    lines: list[str] = []
    for error in exc.errors():
        before = len(lines)
        _format_one(error, lines, root)
        if len(lines) == before + 1 and error["loc"]:
            lines[-1] += _from_env(error["loc"], error.get("input"))
    return lines


_BOUNDS = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">",
           "less_than": "<"}


def _format_one(error: Any, lines: list[str], root: type[BaseModel]) -> None:
    loc, kind, ctx = error["loc"], error["type"], error.get("ctx") or {}
    got = error.get("input")
    where = _dotted(loc)
    if kind == "extra_forbidden":
        model = _model_at(root, loc[:-1])
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
