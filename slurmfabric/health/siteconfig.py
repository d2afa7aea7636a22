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
from slurmfabric.health.checks import amd as _amd

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
    "slurm_conf": "",  # SLURM_CONF for scontrol; "": inherit (HealthCheckProgram gets none)
    "drain": True,  # False: report only, never call scontrol
    "drain_backend": "scontrol",  # how drain/resume reach slurmctld: scontrol | pyslurm
    "drain_retries": 3,
    "drain_retry_s": 1.0,
    "breaker_fraction": 0.1,  # stop draining when this share of nodes has the same reason
    "breaker_min_nodes": 3,  # ... but never trip below this many nodes
    "auto_resume": False,  # hooks resume a node slurmfabric drained once all checks pass
    "lemon_drains": 3,  # a node drained this many times in lemon_window_h is a lemon:
    "lemon_window_h": 24.0,  # its reason says so and nothing of ours resumes it; 0 = off
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
    "link_flap_threshold": 2,  # rdma.link_flaps: link_downed increases in the window that fail
    "link_flap_window_h": 24.0,  # ... and the window, in hours
    "min_free_mem_gb": None,
    "disks": {},  # path -> minimum free GB
    "leftover_ignore": [],  # process names never counted as leftovers
    "commands": [],  # [{name, argv, hooks, timeout_s}] site probes: exit 0 = healthy
    "kmsg_source": "/dev/kmsg",  # the kernel log gpu.xid reads (a recorded stream in tests)
    "xid_drain": [],  # Xids that drain whatever NVIDIA's catalog says (gpu.xid)
    "xid_ignore": [],  # Xids that never drain or warn
    "nvlinks": None,  # active NVLinks per GPU (18 on H100 SXM); None: as many as the best GPU
    #                   has, checked on NVSwitch boards; 0: no NVLink checks
    "nvlink_speed_gbps": None,  # per link (26.562 on H100); None: the fastest link seen
    "nvlink_delta_max": {},  # replay/recovery/crc -> allowed increase during one job
    "nvlink_abs_max": {},  # replay/recovery/crc -> limit when no prolog snapshot exists
    "nvswitch": None,  # None: detect NVSwitch PCI devices; true on HGX B200/GB200 boards
    "dcgmi": "/usr/bin/dcgmi",
    "dcgm_levels": {},  # hook -> dcgmi diag level, e.g. {epilog_failed = 2, burnin = 3}
    "dcgm_timeout_s": {},  # "level" -> seconds before dcgmi is killed (dcgm.DEFAULT_TIMEOUT_S)
    "gpu_stress_argv": [],  # burn-in: this command instead of dcgmi; prints dcgmi -j JSON
    # RoCE (health/checks/roce.py): the declared lossless profile, e.g. {trust = "dscp",
    # pfc_priorities = [3], ecn = true, roce_tos = 106, mtu = 4200}; only keys set are checked
    "roce_profile": {},
    "roce_delta_max": {},  # counter -> allowed increase during one job (roce/profile.py)
    "ethtool": "/usr/sbin/ethtool",
    "mlnx_qos": "/usr/bin/mlnx_qos",  # MLNX_OFED / mlnx-tools; "" to use dcb only
    "dcb": "/usr/sbin/dcb",  # iproute2
    # gpu.clocks (health/checks/clocks.py): power and clocks against the GPU's own limits
    "power_limit_tolerance": 0.05,  # enforced power limit may sit this far below default
    "busy_util_pct": 80,  # a GPU this busy ...
    "sm_clock_min_ratio": 0.5,  # ... with its SM clock below this share of max, a limiter set
    # node.versions / node.version_skew (health/checks/versions.py)
    "versions": {},  # pins: {driver = "550.54.15", hca_fw = ["28.39.1002"], ...}
    "versions_dir": "",  # shared directory for every node's inventory; "": no drift check
    "version_skew_fail": False,  # true: a node unlike the job's majority fails, not warns
    "ofed_info": "/usr/bin/ofed_info",
    "nccl_lib_dirs": [],  # []: this Python's site-packages, then the system library dirs
}

# [runner] keys whose value is one of a fixed set (checked at load, with the choices).
RUNNER_CHOICES: dict[str, tuple[str, ...]] = {"drain_backend": ("scontrol", "pyslurm")}
# (the drain backends themselves live in health/drain.py; drain.BACKENDS is this tuple)

CHECK_POLICY_KEYS = {"enabled", "severity", "action", "on_error", "hooks"}
HOOKS = ("prolog", "epilog", "epilog_failed", "check", "periodic", "burnin")


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


# Numeric keys whose value must lie in a range (low, high), both inclusive; None: no bound.
# NaN and infinities are refused everywhere: a budget of inf would wait forever.
RANGES: dict[str, tuple[float | None, float | None]] = {
    "budget_s": (0.1, 3600), "probe_timeout_s": (0.1, 600), "lock_timeout_s": (0.1, 600),
    "drain_retries": (0, 100), "drain_retry_s": (0, 60), "breaker_fraction": (0.0, 1.0),
    "breaker_min_nodes": (1, None), "keep_reports": (0, 100000),
    "lemon_drains": (0, 100000), "lemon_window_h": (0.01, 87600),
    "gpus": (0, 1024), "gpu_max_temp_c": (0, 150), "gpu_warn_temp_c": (0, 150),
    "pcie_gen": (1, 7), "pcie_width": (1, 32), "retired_pages_max": (0, None),
    "throttle_fail_mask": (0, None), "throttle_warn_mask": (0, None), "rdma_ports": (0, 1024),
    "rdma_rate_gbps": (1, 10000), "min_free_mem_gb": (0, None),
    "nvlinks": (0, 64), "nvlink_speed_gbps": (0.1, 1000),
    "link_flap_threshold": (1, 100000), "link_flap_window_h": (0.01, 8760),
    "power_limit_tolerance": (0.0, 1.0), "busy_util_pct": (0, 100),
    "sm_clock_min_ratio": (0.0, 1.0),
}
INTEGER_KEYS = {"drain_retries", "breaker_min_nodes", "keep_reports", "lemon_drains", "gpus",
                "pcie_gen", "pcie_width", "retired_pages_max", "throttle_fail_mask",
                "throttle_warn_mask", "rdma_ports", "nvlinks", "link_flap_threshold"}
STRING_LISTS = {"rdma_devices", "leftover_ignore", "gpu_stress_argv", "nccl_lib_dirs"}
# A check family that is one file brings its own keys (health/checks/amd.py).
NODE_DEFAULTS.update(_amd.SITE_KEYS)
RANGES.update(_amd.RANGES)
INTEGER_KEYS |= _amd.INTEGER_KEYS
VERSION_PINS = ("driver", "cuda", "vbios", "hca_fw", "ofed", "kernel", "nccl")
NUMBER_MAPS = {"counter_delta_max", "counter_abs_max", "disks", "nvlink_delta_max",
               "nvlink_abs_max", "roce_delta_max"}
NVLINK_COUNTERS = ("replay", "recovery", "crc")  # nvlink.COUNTERS' names
NODE_CHOICES: dict[str, tuple[str, ...]] = {
    "gpu_source": ("auto", "nvml", "nvidia-smi"),
    "rdma_link_layer": ("InfiniBand", "Ethernet"),
}


def _number_problem(value: Any, key: str, integer: bool) -> str | None:
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key} = {_one_line(repr(value))} should be a number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key} = {value!r}: not a finite number"
    if integer and isinstance(value, float) and not value.is_integer():
        return f"{key} = {value!r} should be a whole number"
    low, high = RANGES.get(key, (None, None))
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"{low if low is not None else '-inf'}..{high if high is not None else 'inf'}"
        return f"{key} = {value!r} is outside {span}"
    return None


def _typed(value: Any, default: Any, key: str, where: str, problems: list[str]) -> Any:
    """Type and range checks against the default, so typos fail at load, not at 3 am."""
    def bad(text: str) -> Any:
        problems.append(f"{where}: {text}")
        return default

    if value is None:
        return None
    if key in RANGES:
        problem = _number_problem(value, key, key in INTEGER_KEYS)
        return bad(problem) if problem else value
    if isinstance(default, bool) or key in ("gdr", "nvswitch"):  # true, false or unset (auto)
        return value if isinstance(value, bool) else bad(
            f"{key} = {_one_line(repr(value))} should be true or false")
    if key in STRING_LISTS:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return bad(f"{key} should be a list of strings, got {_one_line(repr(value))[:80]}")
        return value
    if key in ("xid_drain", "xid_ignore"):
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10000 for v in value):
            return bad(f"{key} should be a list of Xid numbers like [79, 48], got "
                       f"{_one_line(repr(value))[:80]}")
        return value
    if key in NUMBER_MAPS:
        if not isinstance(value, dict):
            return bad(f"{key} should be a table of name = number")
        for name, number in value.items():
            problem = _number_problem(number, f"{key}.{name}", key != "disks")
            if problem is None and number < 0:
                problem = f"{key}.{name} = {number!r} is negative"
            if problem:
                return bad(problem)
            if key.startswith("nvlink_") and name not in NVLINK_COUNTERS:
                return bad(f"{key}.{_one_line(repr(name))} is not an NVLink counter; use "
                           f"{', '.join(NVLINK_COUNTERS)}")
        return value
    if key == "commands":
        return _commands(value, where, problems)
    if key in ("dcgm_levels", "dcgm_timeout_s"):
        return _dcgm_table(key, value, bad)
    if key == "roce_profile":
        return _roce_profile(value, bad)
    if key == "versions":
        return _version_pins(value, bad)
    if key in NODE_CHOICES:
        if value not in NODE_CHOICES[key]:
            return bad(f"{key} = {_one_line(repr(value))}; use one of "
                       f"{', '.join(repr(c) for c in NODE_CHOICES[key])}")
        return value
    if default is not None and not isinstance(value, type(default)):
        return bad(f"{key} = {_one_line(repr(value))} should be a {type(default).__name__} "
                   f"like {default!r}")
    if isinstance(value, str) and ("\x00" in value or "\n" in value):
        return bad(f"{key} = {_one_line(repr(value))}: NUL or newline in a value")
    return value


# roce_profile keys: (type check, what the value must be); the fields of roce/profile.py
# Profile, whose delta_max comes from roce_delta_max instead.
_ROCE_PROFILE = {
    "trust": (lambda v: v in ("dscp", "pcp"), '"dscp" or "pcp"'),
    "pfc_priorities": (lambda v: isinstance(v, list) and all(
        isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= 7 for p in v)
        and len(set(v)) == len(v), "a list of priorities 0-7, e.g. [3]"),
    "ecn": (lambda v: isinstance(v, bool), "true or false"),
    "roce_tos": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255,
                 "a ToS byte 0-255, e.g. 106 (DSCP 26)"),
    "mtu": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 1280 <= v <= 9216,
            "the netdev MTU 1280-9216, e.g. 4200"),
    "cnp_dscp": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 63,
                 "a DSCP 0-63, e.g. 48"),
}


def _roce_profile(value: Any, bad: Any) -> Any:
    if not isinstance(value, dict):
        return bad('roce_profile should be a table, e.g. roce_profile = { trust = "dscp", '
                   "pfc_priorities = [3], ecn = true, roce_tos = 106, mtu = 4200 }")
    for name, item in value.items():
        rule = _ROCE_PROFILE.get(name)
        if rule is None:
            return bad(f"roce_profile.{_one_line(repr(name))} is not a profile key; use "
                       f"{', '.join(_ROCE_PROFILE)}")
        if not rule[0](item):
            return bad(f"roce_profile.{name} = {_one_line(repr(item))[:60]} should be "
                       f"{rule[1]}")
    return value


def _version_pins(value: Any, bad: Any) -> Any:
    """``versions = {driver = "550.54.15", hca_fw = ["28.39.1002", "22.39.1002"]}``."""
    if not isinstance(value, dict):
        return bad('versions should be a table, e.g. versions = { driver = "550.54.15" }')
    for name, item in value.items():
        if name not in VERSION_PINS:
            return bad(f"versions.{_one_line(repr(name))} is not a component; use "
                       f"{', '.join(VERSION_PINS)}")
        items = item if isinstance(item, list) else [item]
        if not items or not all(isinstance(v, str) and v.strip() and "\n" not in v
                                for v in items):
            return bad(f"versions.{name} = {_one_line(repr(item))[:60]} should be a version "
                       "string or a list of them")
    return value


def _dcgm_table(key: str, value: Any, bad: Any) -> Any:
    """``dcgm_levels = {epilog_failed = 2, burnin = 3}`` (hook -> level 0-4) and
    ``dcgm_timeout_s = {"2" = 900}`` (level -> seconds, up to 4 h)."""
    if not isinstance(value, dict):
        return bad(f"{key} should be a table, e.g. {key} = "
                   + ("{ epilog_failed = 2, burnin = 3 }" if key == "dcgm_levels"
                      else '{ "2" = 900 }'))
    for name, number in value.items():
        if key == "dcgm_levels":
            if name not in HOOKS:
                return bad(f"{key}.{_one_line(repr(name))}: not a hook; use "
                           f"{', '.join(HOOKS)}")
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= 4:
                return bad(f"{key}.{name} = {_one_line(repr(number))} should be a dcgmi diag "
                           "level 0-4")
        else:
            if name not in ("1", "2", "3", "4"):
                return bad(f"{key}.{_one_line(repr(name))}: not a level; use \"1\" to \"4\"")
            problem = _number_problem(number, f"{key}.{name}", False)
            if problem is None and not 1 <= number <= 14400:
                problem = f"{key}.{name} = {number!r} is outside 1..14400"
            if problem:
                return bad(problem)
    return value


def _commands(value: Any, where: str, problems: list[str]) -> list[Any]:
    """``commands = [{name, argv, hooks, timeout_s}]``: site probes, each argv a list."""
    if not isinstance(value, list):
        problems.append(f"{where}: commands should be a list of tables")
        return []
    for i, item in enumerate(value, 1):
        at = f"{where}: commands #{i}"
        if not isinstance(item, dict):
            problems.append(f"{at} should be a table with name and argv")
            continue
        argv = item.get("argv")
        if not isinstance(item.get("name"), str) or not item.get("name"):
            problems.append(f"{at}: name should be a non-empty string")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            problems.append(f"{at}: argv should be a non-empty list of strings")
        hooks = item.get("hooks", [])
        if not isinstance(hooks, list) or not all(h in HOOKS for h in hooks):
            problems.append(f"{at}: hooks should be a list of {', '.join(HOOKS)}")
        if "timeout_s" in item:
            problem = _number_problem(item["timeout_s"], "timeout_s", False)
            if problem is None and not 0 < item["timeout_s"] <= 600:
                problem = f"timeout_s = {item['timeout_s']!r} is outside 0..600"
            if problem:
                problems.append(f"{at}: {problem}")
    return value


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
    _check_keys(raw_runner, set(RUNNER_DEFAULTS), "[runner]", problems)
    for key, value in raw_runner.items():
        if key in RUNNER_DEFAULTS:
            runner[key] = _typed(value, RUNNER_DEFAULTS[key], key, "[runner]", problems)
        allowed = RUNNER_CHOICES.get(key)
        if allowed and isinstance(value, str) and value not in allowed:
            problems.append(f"[runner]: {key} = {value!r}; use one of "
                            f"{', '.join(repr(a) for a in allowed)}")
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
            if key != "match" and key in NODE_DEFAULTS:
                expect[key] = _typed(value, NODE_DEFAULTS[key], key, where, problems)
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
