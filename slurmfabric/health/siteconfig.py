"""The site config: what "expected" means on each node, and per-check policy.

``/etc/slurmfabric/health.toml`` (override with ``SLURMFABRIC_HEALTH_CONFIG`` or ``--config``).
Standard library only (tomllib, or tomli before 3.11): this module is on the hook path, so no
pydantic. Node sets are selected by hostlist expression; every ``[[nodes]]`` block whose
``match`` covers the node is merged in file order, later blocks overriding earlier ones::

    [runner]
    budget_s = 20
    state_dir = "/var/lib/slurmfabric/health"
    drain_backend = "scontrol"   # or "pyslurm" (optional, GPL, built for this Slurm)

    [[nodes]]
    match = "gpu[001-128]"
    gpus = 8
    pcie_gen = 5
    pcie_width = 16
    rdma_ports = 8
    rdma_rate_gbps = 400

    [checks."gpu.temperature"]
    severity = "warn"        # a failure only warns
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmfabric._common.textcheck import one_line as _one_line
from slurmfabric._common.tomlfile import read_toml_file
from slurmfabric.errors import ConfigError
from slurmfabric.health.families import FAMILIES
from slurmfabric.health.family import HOOKS, Key, number_problem

DEFAULT_PATH = "/etc/slurmfabric/health.toml"
CONFIG_ENV = "SLURMFABRIC_HEALTH_CONFIG"

# [runner] keys and defaults. The budget must stay below slurm.conf's PrologEpilogTimeout.
RUNNER_KEYS: dict[str, Key] = {
    "budget_s": Key(20.0, (0.1, 3600)),  # all probes together; unfinished checks are errors
    "probe_timeout_s": Key(5.0, (0.1, 600)),  # one probe (nvidia-smi ...) before it is killed
    "lock_timeout_s": Key(10.0, (0.1, 600)),  # waiting for the node's state lock
    "state_dir": Key("/var/lib/slurmfabric/health"),
    "log_file": Key("/var/log/slurmfabric/health.log"),
    "report_dir": Key(""),  # default: <state_dir>/reports
    "prometheus_file": Key(""),  # e.g. /var/lib/prometheus/node-exporter/slurmfabric_health.prom
    "syslog": Key(True),
    "slurm_bin_dir": Key(""),  # prepended to PATH for scontrol (hooks run with no PATH)
    "slurm_conf": Key(""),  # SLURM_CONF for scontrol; "": inherit
    "drain": Key(True),  # False: report only, never call scontrol
    # how drain/resume reach slurmctld (health/drain.py BACKENDS)
    "drain_backend": Key("scontrol", choices=("scontrol", "pyslurm")),
    "drain_retries": Key(3, (0, 100), integer=True),
    "drain_retry_s": Key(1.0, (0, 60)),
    "breaker_fraction": Key(0.1, (0.0, 1.0)),  # stop draining when this share has one reason
    "breaker_min_nodes": Key(3, (1, None), integer=True),  # ... but never below this many
    "auto_resume": Key(False),  # hooks resume a node slurmfabric drained once all checks pass
    "lemon_drains": Key(3, (0, 100000), integer=True),  # drained this often in the window:
    "lemon_window_h": Key(24.0, (0.01, 87600)),  # a lemon, never resumed by us; 0 = off
    "scope_to_job_gpus": Key(True),  # per-GPU checks look only at SLURM_JOB_GPUS when set
    "keep_reports": Key(50, (0, 100000), integer=True),
}
RUNNER_DEFAULTS: dict[str, Any] = {name: key.default for name, key in RUNNER_KEYS.items()}

# [[nodes]] keys: the ones every family shares, then each family's own (health/checks/).
NODE_KEYS: dict[str, Key] = {
    "match": Key("*"),
    "sysfs_root": Key("/"),
    "commands": Key([], check=lambda value: _commands_problem(value)),  # site probes
}
for _family in FAMILIES:
    NODE_KEYS.update(_family.keys)
NODE_DEFAULTS: dict[str, Any] = {name: key.default for name, key in NODE_KEYS.items()}

CHECK_POLICY_KEYS = {"enabled", "severity", "action", "on_error", "hooks"}


@dataclass(frozen=True)
class CheckPolicy:
    """Per-check site policy; None means "the check's own default"."""

    enabled: bool = True
    severity: str | None = None  # "warn": a failure only warns
    action: str | None = None  # "drain" | "report"
    on_error: str | None = None  # "fail" (fail-closed) | "pass" (fail-open)
    hooks: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SiteConfig:
    path: str | None
    node: str
    runner: dict[str, Any]
    expect: dict[str, Any]
    checks: dict[str, CheckPolicy] = field(default_factory=dict)

    def policy(self, check: str) -> CheckPolicy:
        """The policy for ``gpu.ecc``: its own entry, else its family's (``gpu``)."""
        if check in self.checks:
            return self.checks[check]
        return self.checks.get(check.split(".")[0], CheckPolicy())

    @property
    def state_dir(self) -> Path:
        return Path(self.runner["state_dir"])

    @property
    def report_dir(self) -> Path:
        return Path(self.runner["report_dir"] or self.state_dir / "reports")


MAX_CONFIG_BYTES = 1 << 20  # a health config is a few KiB; /dev/zero must not be read whole


def _load_toml(path: Path) -> dict[str, Any]:
    return read_toml_file(path, MAX_CONFIG_BYTES,
                          hint="point --config / SLURMFABRIC_HEALTH_CONFIG at a TOML file")


def config_path(explicit: str | None = None) -> tuple[Path, bool]:
    """The config file to read and whether the user named it (then it must exist)."""
    if explicit:
        return Path(explicit), True
    env = os.environ.get(CONFIG_ENV)
    if env:  # the hook scripts always export it; the default path may still be absent
        return Path(env), env != DEFAULT_PATH
    return Path(DEFAULT_PATH), False


def load(node: str, explicit: str | None = None) -> SiteConfig:
    """Read the site config and resolve it for ``node``; defaults when no default file."""
    path, named = config_path(explicit)
    if not path.exists():
        if named:
            raise ConfigError(
                [f"health config {path} does not exist"],
                hint=f"create it, or unset {CONFIG_ENV} to use {DEFAULT_PATH}",
            )
        return resolve({}, node, None)
    data = _load_toml(path)
    try:
        return resolve(data, node, str(path))
    except ConfigError:
        raise
    except (TypeError, AttributeError, ValueError, KeyError, RecursionError) as exc:
        # a shape resolve() does not know yet: still one line, still the config's fault
        raise ConfigError([f"{path}: cannot be read as a health config: "
                           f"{type(exc).__name__}: {_one_line(str(exc))}"]) from None


def salvage_runner(explicit: str | None = None) -> dict[str, Any]:
    """Where a broken config wanted its log file and metrics, as far as can be read safely:
    the defaults, with [runner] log_file/prometheus_file taken over when they are strings."""
    runner = dict(RUNNER_DEFAULTS)
    try:
        path, _ = config_path(explicit)
        data = _load_toml(path)
    except Exception:
        return runner
    raw = data.get("runner") if isinstance(data, dict) else None
    if isinstance(raw, dict):
        for key in ("log_file", "prometheus_file"):
            value = raw.get(key)
            if isinstance(value, str) and "\x00" not in value:
                runner[key] = value
    return runner


def _check_keys(table: dict[str, Any], known: set[str], where: str, problems: list[str]) -> None:
    for key in table:
        if key not in known:
            problems.append(f"unknown key {_one_line(repr(key))} in {where}; known keys: "
                            f"{', '.join(sorted(known))}")


def _typed(value: Any, key: Key, name: str, where: str, problems: list[str]) -> Any:
    problem = key.problem(name, value)
    if problem:
        problems.append(f"{where}: {problem}")
        return key.default
    return value


def _commands_problem(value: Any) -> str | None:
    """``commands = [{name, argv, hooks, timeout_s}]``: site probes, each argv a list."""
    if not isinstance(value, list):
        return "commands should be a list of tables"
    for i, item in enumerate(value, 1):
        at = f"commands #{i}"
        if not isinstance(item, dict):
            return f"{at} should be a table with name and argv"
        argv = item.get("argv")
        if not isinstance(item.get("name"), str) or not item.get("name"):
            return f"{at}: name should be a non-empty string"
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return f"{at}: argv should be a non-empty list of strings"
        hooks = item.get("hooks", [])
        if not isinstance(hooks, list) or not all(h in HOOKS for h in hooks):
            return f"{at}: hooks should be a list of {', '.join(HOOKS)}"
        if "timeout_s" in item:
            problem = number_problem(item["timeout_s"], "timeout_s", False, (0, 600))
            if problem is None and item["timeout_s"] == 0:
                problem = "timeout_s = 0 is outside 0..600"
            if problem:
                return f"{at}: {problem}"
    return None


def resolve(data: dict[str, Any], node: str, path: str | None) -> SiteConfig:
    """Merge the parsed TOML into the settings that apply to ``node``."""
    problems: list[str] = []
    where_file = path or "<defaults>"
    _check_keys(data, {"runner", "nodes", "checks"}, where_file, problems)
    runner = dict(RUNNER_DEFAULTS)
    raw_runner = data.get("runner", {})
    raw_nodes = data.get("nodes", [])
    raw_checks = data.get("checks", {})
    if not isinstance(raw_runner, dict):
        problems.append(f"runner should be a table ([runner]), got {_one_line(repr(raw_runner))}")
        raw_runner = {}
    if not isinstance(raw_nodes, list) or not all(isinstance(b, dict) for b in raw_nodes):
        problems.append("nodes should be an array of tables ([[nodes]] blocks), got "
                        f"{_one_line(repr(raw_nodes))[:80]}")
        raw_nodes = []
    if not isinstance(raw_checks, dict):
        problems.append(f"checks should be a table ([checks.NAME]), got "
                        f"{_one_line(repr(raw_checks))[:80]}")
        raw_checks = {}
    _check_keys(raw_runner, set(RUNNER_KEYS), "[runner]", problems)
    for key, value in raw_runner.items():
        if key in RUNNER_KEYS:
            runner[key] = _typed(value, RUNNER_KEYS[key], key, "[runner]", problems)
    expect = {k: v for k, v in NODE_DEFAULTS.items() if k != "match"}
    for i, block in enumerate(raw_nodes, 1):
        where = f"[[nodes]] #{i}"
        _check_keys(block, set(NODE_DEFAULTS), where, problems)
        match = block.get("match", "*")
        if not isinstance(match, str):
            problems.append(f"{where}: match = {_one_line(repr(match))} should be a hostlist "
                            "string like 'gpu[001-128]'")
            continue
        try:
            covered = node_matches(node, match)
        except ValueError as exc:
            problems.append(f"{where}: match: {exc}")
            continue
        if not covered:
            continue
        for key, value in block.items():
            if key != "match" and key in NODE_KEYS:
                expect[key] = _typed(value, NODE_KEYS[key], key, where, problems)
    checks: dict[str, CheckPolicy] = {}
    for name, table in raw_checks.items():
        where = f"[checks.{name!r}]"
        if not isinstance(table, dict):
            problems.append(f"{where} must be a table")
            continue
        _check_keys(table, CHECK_POLICY_KEYS, where, problems)
        checks[name] = _policy(table, where, problems)
    if problems:
        raise ConfigError([f"{where_file}: {p}" for p in problems],
                          hint="see 'slurmfabric health check --help' for the config format")
    # "{node}" in state_dir: one directory per node on a shared filesystem (or several
    # virtual nodes on one host), so hooks of different nodes never share one state lock.
    runner["state_dir"] = str(runner["state_dir"]).replace("{node}", node)
    return SiteConfig(path, node, runner, expect, checks)


def _policy(table: dict[str, Any], where: str, problems: list[str]) -> CheckPolicy:
    choices = {"severity": ("fail", "warn"), "action": ("drain", "report"),
               "on_error": ("fail", "pass")}
    for key, allowed in choices.items():
        if key in table and (not isinstance(table[key], str) or table[key] not in allowed):
            problems.append(f"{where}: {key} = {table[key]!r}; use one of {allowed}")
    hooks = table.get("hooks")
    if hooks is not None:
        if not isinstance(hooks, list):
            problems.append(f"{where}: hooks should be a list of {', '.join(HOOKS)}")
            hooks = []
        bad = [h for h in hooks if h not in HOOKS]
        if bad:
            problems.append(f"{where}: hooks {_one_line(repr(bad))} unknown; use some of {HOOKS}")
        hooks = tuple(h for h in hooks if isinstance(h, str))
    if "enabled" in table and not isinstance(table["enabled"], bool):
        problems.append(f"{where}: enabled should be true or false")
    return CheckPolicy(
        enabled=bool(table.get("enabled", True)),
        severity=table.get("severity"),
        action=table.get("action"),
        on_error=table.get("on_error"),
        hooks=hooks,
    )


def node_matches(node: str, expr: str) -> bool:
    """Is ``node`` in the hostlist ``expr`` (Slurm syntax)? ``*`` matches every node."""
    if expr.strip() == "*":
        return True
    from slurmfabric.slurm.hostlist import HostlistError, expand

    try:
        return node in expand(expr)
    except HostlistError as exc:
        raise ValueError(str(exc)) from exc
