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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmfabric.errors import ConfigError

DEFAULT_PATH = "/etc/slurmfabric/health.toml"
CONFIG_ENV = "SLURMFABRIC_HEALTH_CONFIG"

# [runner] keys and defaults. The budget must stay below slurm.conf's PrologEpilogTimeout.
RUNNER_DEFAULTS: dict[str, Any] = {
    "budget_s": 20.0,  # all probes together; checks still unfinished are reported as errors
    "probe_timeout_s": 5.0,  # one probe (nvidia-smi ...) before it is killed
    "lock_timeout_s": 10.0,  # waiting for the node's state lock; then the hook fails loudly
    "state_dir": "/var/lib/slurmfabric/health",
    "log_file": "/var/log/slurmfabric/health.log",
    "report_dir": "",  # default: <state_dir>/reports
    "prometheus_file": "",  # e.g. /var/lib/prometheus/node-exporter/slurmfabric_health.prom
    "syslog": True,
    "slurm_bin_dir": "",  # prepended to PATH for scontrol (hooks run with no PATH)
    "drain": True,  # False: report only, never call scontrol
    "drain_backend": "scontrol",  # how drain/resume reach slurmctld: scontrol | pyslurm
    "drain_retries": 3,
    "drain_retry_s": 1.0,
    "breaker_fraction": 0.1,  # stop draining when this share of nodes has the same reason
    "breaker_min_nodes": 3,  # ... but never trip below this many nodes
    "auto_resume": False,  # hooks resume a node slurmfabric drained once all checks pass
    "scope_to_job_gpus": True,  # per-GPU checks look only at SLURM_JOB_GPUS when set
    "keep_reports": 50,
}

# [[nodes]] keys and defaults: the node's expected hardware and limits.
NODE_DEFAULTS: dict[str, Any] = {
    "match": "*",
    "gpus": None,  # None: check GPUs only if nvidia-smi/NVML exists; 0: no GPU checks
    "gpu_source": "auto",  # auto (NVML, else nvidia-smi) | nvml | nvidia-smi
    "nvidia_smi": "/usr/bin/nvidia-smi",
    "gpu_max_temp_c": 87,
    "gpu_warn_temp_c": 80,
    "pcie_gen": None,  # None: compare with the GPU's own pcie.link.gen.max
    "pcie_width": None,  # None: compare with pcie.link.width.max
    "retired_pages_max": 60,
    "throttle_fail_mask": 0x8 | 0x40 | 0x80,  # HW slowdown, HW thermal, power brake
    "throttle_warn_mask": 0x20,  # SW thermal
    "sysfs_root": "/",
    "rdma_ports": None,  # None: check the ports found; 0: no RDMA checks
    "rdma_rate_gbps": None,
    "rdma_link_layer": None,  # InfiniBand | Ethernet
    "rdma_devices": [],  # ["mlx5_0", "mlx5_1:1"]: only these (all ports or one port)
    "gdr": None,  # True: require GPUDirect RDMA (peermem or DMA-BUF); None: when GPUs+RDMA
    "counter_delta_max": {},  # counter -> allowed increase during one job
    "counter_abs_max": {},  # counter -> absolute limit when no prolog snapshot exists
    "min_free_mem_gb": None,
    "disks": {},  # path -> minimum free GB
    "leftover_ignore": [],  # process names never counted as leftovers
    "commands": [],  # [{name, argv, hooks, timeout_s}] site probes: exit 0 = healthy
}

# [runner] keys whose value is one of a fixed set (checked at load, with the choices).
RUNNER_CHOICES: dict[str, tuple[str, ...]] = {"drain_backend": ("scontrol", "pyslurm")}

CHECK_POLICY_KEYS = {"enabled", "severity", "action", "on_error", "hooks"}
HOOKS = ("prolog", "epilog", "epilog_failed", "check")


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


def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10 only
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from exc


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
    return resolve(_load_toml(path), node, str(path))


def _check_keys(table: dict[str, Any], known: set[str], where: str, problems: list[str]) -> None:
    for key in table:
        if key not in known:
            problems.append(
                f"unknown key {key!r} in {where}; known keys: {', '.join(sorted(known))}")


def _typed(value: Any, default: Any, key: str, where: str, problems: list[str]) -> Any:
    """Light type checking against the default's type, so typos fail at load, not at 3 am."""
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        problems.append(
            f"{where}: {key} = {value!r} should be a {type(default).__name__} like {default!r}"
        )
    return value


def resolve(data: dict[str, Any], node: str, path: str | None) -> SiteConfig:
    """Merge the parsed TOML into the settings that apply to ``node``."""
    problems: list[str] = []
    where_file = path or "<defaults>"
    _check_keys(data, {"runner", "nodes", "checks"}, where_file, problems)
    runner = dict(RUNNER_DEFAULTS)
    raw_runner = data.get("runner", {})
    _check_keys(raw_runner, set(RUNNER_DEFAULTS), "[runner]", problems)
    for key, value in raw_runner.items():
        if key in RUNNER_DEFAULTS:
            runner[key] = _typed(value, RUNNER_DEFAULTS[key], key, "[runner]", problems)
        allowed = RUNNER_CHOICES.get(key)
        if allowed and isinstance(value, str) and value not in allowed:
            problems.append(f"[runner]: {key} = {value!r}; use one of "
                            f"{', '.join(repr(a) for a in allowed)}")
    expect = {k: v for k, v in NODE_DEFAULTS.items() if k != "match"}
    for i, block in enumerate(data.get("nodes", []), 1):
        where = f"[[nodes]] #{i}"
        _check_keys(block, set(NODE_DEFAULTS), where, problems)
        try:
            covered = node_matches(node, str(block.get("match", "*")))
        except ValueError as exc:
            problems.append(f"{where}: match: {exc}")
            continue
        if not covered:
            continue
        for key, value in block.items():
            if key != "match" and key in NODE_DEFAULTS:
                expect[key] = _typed(value, NODE_DEFAULTS[key], key, where, problems)
    checks: dict[str, CheckPolicy] = {}
    for name, table in data.get("checks", {}).items():
        where = f"[checks.{name!r}]"
        if not isinstance(table, dict):
            problems.append(f"{where} must be a table")
            continue
        _check_keys(table, CHECK_POLICY_KEYS, where, problems)
        checks[name] = _policy(table, where, problems)
    if problems:
        raise ConfigError([f"{where_file}: {p}" for p in problems],
                          hint="see 'slurmfabric health check --help' for the config format")
    return SiteConfig(path, node, runner, expect, checks)


def _policy(table: dict[str, Any], where: str, problems: list[str]) -> CheckPolicy:
    choices = {"severity": ("fail", "warn"), "action": ("drain", "report"),
               "on_error": ("fail", "pass")}
    for key, allowed in choices.items():
        if key in table and table[key] not in allowed:
            problems.append(f"{where}: {key} = {table[key]!r}; use one of {allowed}")
    hooks = table.get("hooks")
    if hooks is not None:
        bad = [h for h in hooks if h not in HOOKS]
        if bad:
            problems.append(f"{where}: hooks {bad} unknown; use some of {HOOKS}")
        hooks = tuple(hooks)
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
    from slurmfabric.hostlist import HostlistError, expand

    try:
        return node in expand(expr)
    except HostlistError as exc:
        raise ValueError(str(exc)) from exc
