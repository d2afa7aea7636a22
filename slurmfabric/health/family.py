"""What a check family declares in its one file, ``health/checks/<family>.py``.

A family is its site keys (typed, with their defaults, checked at load), the facts it
gathers (each with its collector and when it applies) and the checks that judge each fact.
The runner walks ``health/families.FAMILIES`` and the site config takes its ``[[nodes]]``
keys from the same tuple, so adding a family is one new file plus one name there
(docs/health.md, "Adding a check family"). Standard library only: this is the hook path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

from slurmfabric._common.textcheck import one_line

# The hooks a check can run in (health/hooks.py runs them; docs/health.md, "Hooks").
HOOKS = ("prolog", "epilog", "epilog_failed", "check", "periodic", "burnin")

Span = tuple[float | None, float | None]


def number_problem(value: Any, name: str, integer: bool = False,
                   span: Span | None = None) -> str | None:
    """Why ``value`` is not a finite number (a whole one when ``integer``) in ``span``.
    NaN and infinities are refused everywhere: a budget of inf would wait forever."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} = {one_line(repr(value))} should be a number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} = {value!r}: not a finite number"
    if integer and isinstance(value, float) and not value.is_integer():
        return f"{name} = {value!r} should be a whole number"
    low, high = span or (None, None)
    if (low is not None and value < low) or (high is not None and value > high):
        shown = f"{low if low is not None else '-inf'}..{high if high is not None else 'inf'}"
        return f"{name} = {value!r} is outside {shown}"
    return None


def table_problem(value: Any, name: str, example: str,
                  item: Callable[[str, Any], str | None]) -> str | None:
    """A TOML table's first problem: not a table (shown ``example``), else the first of
    ``item(name, value)`` over its entries."""
    if not isinstance(value, dict):
        return f"{name} should be a table, e.g. {name} = {example}"
    return next((p for p in (item(k, v) for k, v in value.items()) if p), None)


def _xid_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10000 for v in value)


@dataclass(frozen=True)
class Key:
    """One site-config key: its default and what a value must be.

    ``kind``: "" (the default's type), "flag" (true, false or unset), "strings" (a list of
    strings), "xids" (a list of Xid numbers), "numbers" (a table of name = number, not
    negative; ``names`` limits the names). ``check`` is a table's own rule (a problem text
    or None)."""

    default: Any = None
    span: Span | None = None
    integer: bool = False
    kind: str = ""
    choices: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    names_are: str = "a known name"  # what ``names`` are, for the message
    check: Callable[[Any], str | None] | None = None

    def problem(self, name: str, value: Any) -> str | None:
        """Why ``value`` cannot be this key's value (None: it can), so typos fail at load,
        not at 3 am."""
        if value is None:
            return None
        if self.kind == "numbers":
            return self._numbers_problem(name, value)
        if self.span is not None or self.integer:
            return number_problem(value, name, self.integer, self.span)
        if self.kind == "flag" or isinstance(self.default, bool):
            return None if isinstance(value, bool) else (
                f"{name} = {one_line(repr(value))} should be true or false")
        if self.kind == "strings":
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return None
            return f"{name} should be a list of strings, got {one_line(repr(value))[:80]}"
        if self.kind == "xids":
            return None if _xid_list(value) else (
                f"{name} should be a list of Xid numbers like [79, 48], got "
                f"{one_line(repr(value))[:80]}")
        if self.check is not None:
            return self.check(value)
        if self.choices:
            return None if value in self.choices else (
                f"{name} = {one_line(repr(value))}; use one of "
                f"{', '.join(repr(c) for c in self.choices)}")
        if self.default is not None and not isinstance(value, type(self.default)):
            return (f"{name} = {one_line(repr(value))} should be a "
                    f"{type(self.default).__name__} like {self.default!r}")
        if isinstance(value, str) and ("\x00" in value or "\n" in value):
            return f"{name} = {one_line(repr(value))}: NUL or newline in a value"
        return None

    def _numbers_problem(self, name: str, value: Any) -> str | None:
        def entry(item: str, number: Any) -> str | None:
            problem = number_problem(number, f"{name}.{item}", self.integer)
            if problem is None and number < 0:
                problem = f"{name}.{item} = {number!r} is negative"
            if problem is None and self.names and item not in self.names:
                problem = (f"{name}.{one_line(repr(item))} is not {self.names_are}; use "
                           f"{', '.join(self.names)}")
            return problem

        return table_problem(value, name, "{ NAME = 0 }", entry)


def always(_run: Any) -> bool:
    return True


def never(_run: Any) -> bool:
    return False


# name -> (judge(fact, expect, ctx) -> CheckResult, "fail"|"pass" when it errs, hooks)
CheckTable = Mapping[str, tuple[Callable[..., Any], str, tuple[str, ...]]]


@dataclass(frozen=True)
class Fact:
    """One thing a family gathers, once per hook run, and the checks that judge it.

    ``gate``: whether this node has what the fact is about (GPUs, RDMA ports...).
    ``baseline``: the prolog gathers it even with no active check (the epilog's deltas
    start from it). ``budget``: seconds its collector needs beyond the runner's budget.
    ``events``: checks that judge events since the last run, not a state: passing later
    proves no repair, so their drains are never resumed automatically (hooks._clear_stale).
    """

    name: str
    collect: Callable[[Any, float], Any]  # (health.runner.Gathering, seconds) -> facts
    checks: CheckTable
    gate: Callable[[Any], bool] = always
    baseline: Callable[[Any], bool] = never
    budget: Callable[[Any], float] | None = None
    events: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Family:
    """A check family: its ``[[nodes]]`` keys and its facts."""

    name: str
    keys: Mapping[str, Key] = field(default_factory=dict)
    facts: tuple[Fact, ...] = ()

    def defaults(self) -> dict[str, Any]:
        """Each key's default: what a node without a ``[[nodes]]`` value gets."""
        return {name: key.default for name, key in self.keys.items()}


@dataclass(frozen=True)
class Gathering:
    """What a gate or a collector may read: the node's resolved site config, the hook's
    context and the names of the checks that will run."""

    cfg: Any  # health.siteconfig.SiteConfig
    ctx: Any  # health.model.Context
    active: frozenset[str] = frozenset()
    memo: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def expect(self) -> dict[str, Any]:
        return self.cfg.expect

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` once per hook run (a sysfs scan that a gate and a collector share)."""
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]
