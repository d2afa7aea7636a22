"""GPU power limits and clocks against the GPU's own limits (``gpu.clocks``).

The throttle bitmask (``gpu.throttle``) says *why* clocks are low right now, not whether
the GPU is capped for every job: an enforced power limit below the default (someone ran
``nvidia-smi -pl``, or a BMC/firmware cap), application clocks set below their default
(``nvidia-smi -ac``), or SM clocks far below their maximum while the GPU is busy all pass
it. This module reads ``nvidia-smi -q -d POWER,CLOCK,PERFORMANCE,UTILIZATION`` (the
sections "GPU Power Readings" / "Power Readings", "Clocks", "Max Clocks", "Applications
Clocks", "Default Applications Clocks", "Clocks Event Reasons" / "Clocks Throttle Reasons",
"Utilization"; field meanings in nvidia-smi(1), "GPU ATTRIBUTES") and judges them.

Field names changed over driver generations; both are read:
- before ~530: ``Power Limit`` (requested), ``Enforced Power Limit``;
- since: ``Requested Power Limit`` and ``Current Power Limit`` (the enforced one, NVML
  ``nvmlDeviceGetEnforcedPowerLimit``: "the minimum of various power limiters").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slurmfabric._common.probe import ProbeError
from slurmfabric.health.checks.gpu import gathered
from slurmfabric.health.family import Fact, Family, Key
from slurmfabric.health.model import FAIL, OK, CheckResult, Metric

Q_ARGS = ["-q", "-d", "POWER,CLOCK,PERFORMANCE,UTILIZATION"]
_GPU_HEAD = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(W|MHz|%)?$")
IDLE = "Idle"


@dataclass
class QReport:
    """One ``nvidia-smi -q`` report: the header and each GPU's fields by section path."""

    header: dict[str, str] = field(default_factory=dict)
    gpus: list[dict[str, str]] = field(default_factory=list)  # "Section/Key" -> raw value
    bus_ids: list[str] = field(default_factory=list)


def parse_q(text: str) -> QReport:
    """Parse the indented ``key : value`` report. Section lines (no value) nest by indent;
    a field's key is ``Section/Sub/Key``. Unknown sections are kept, never an error."""
    report = QReport()
    current: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        match = _GPU_HEAD.match(raw)
        if match:
            current, stack = {}, []
            report.gpus.append(current)
            report.bus_ids.append(match.group(1))
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        if current is None:
            if sep:
                report.header[key] = value
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not sep or not value:
            stack.append((indent, key))
            continue
        current["/".join([name for _, name in stack] + [key])] = value
    return report


def number(text: str | None) -> float | None:
    """``700.00 W`` / ``1980 MHz`` / ``35 %`` -> a number; N/A, "Requested functionality has
    been deprecated", "Not Found", "Unknown Error" -> None."""
    if text is None:
        return None
    match = _NUMBER.match(text.strip())
    return float(match.group(1)) if match else None


def _first(fields: dict[str, str], *keys: str) -> float | None:
    for key in keys:
        value = number(fields.get(key))
        if value is not None:
            return value
    return None


def gpu_limits(fields: dict[str, str]) -> dict[str, object]:
    """The figures this check judges, from one GPU's fields (None where not reported)."""
    power = {}
    for section in ("GPU Power Readings", "Power Readings"):
        if any(k.startswith(section + "/") for k in fields):
            power = {k.split("/", 1)[1]: v for k, v in fields.items()
                     if k.startswith(section + "/")}
            break
    reasons = []
    for section in ("Clocks Event Reasons", "Clocks Throttle Reasons"):
        for key, value in fields.items():
            if key.startswith(section + "/") and value == "Active":
                reasons.append(key.rsplit("/", 1)[1])
    return {
        "power_enforced_w": _first(power, "Current Power Limit", "Enforced Power Limit"),
        "power_requested_w": _first(power, "Requested Power Limit", "Power Limit"),
        "power_default_w": _first(power, "Default Power Limit"),
        "power_min_w": _first(power, "Min Power Limit"),
        "power_max_w": _first(power, "Max Power Limit"),
        "sm_mhz": _first(fields, "Clocks/SM"),
        "sm_max_mhz": _first(fields, "Max Clocks/SM"),
        "app_graphics_mhz": _first(fields, "Applications Clocks/Graphics"),
        "app_default_graphics_mhz": _first(fields, "Default Applications Clocks/Graphics"),
        "app_memory_mhz": _first(fields, "Applications Clocks/Memory"),
        "app_default_memory_mhz": _first(fields, "Default Applications Clocks/Memory"),
        "util_pct": _first(fields, "Utilization/Gpu"),
        "pstate": fields.get("Performance State"),
        "reasons": reasons,
    }


@dataclass(frozen=True)
class ClockFacts:
    gpus: list[dict[str, object]]  # gpu_limits() plus index and bus_id
    driver: str | None
    cuda: str | None


def facts_from_text(text: str) -> ClockFacts:
    report = parse_q(text)
    if not report.gpus:
        raise ProbeError("nvidia-smi -q: no GPU sections in its output")
    gpus = []
    for index, (bus, fields) in enumerate(zip(report.bus_ids, report.gpus)):
        # -q lists GPUs in nvidia-smi's index order (the index --query-gpu prints).
        gpus.append({"index": index, "bus_id": bus, **gpu_limits(fields)})
    return ClockFacts(gpus, report.header.get("Driver Version"),
                      report.header.get("CUDA Version"))


# NVML clocks-event-reason bits (nvml.h nvmlClocksEventReason*) -> the names -q prints.
REASON_BITS = {0x1: IDLE, 0x2: "Applications Clocks Setting", 0x4: "SW Power Cap",
               0x8: "HW Slowdown", 0x10: "Sync Boost", 0x20: "SW Thermal Slowdown",
               0x40: "HW Thermal Slowdown", 0x80: "HW Power Brake Slowdown",
               0x100: "Display Clock Setting"}
_KEYS = ("power_enforced_w", "power_requested_w", "power_default_w", "power_min_w",
         "power_max_w", "sm_mhz", "sm_max_mhz", "app_graphics_mhz", "app_default_graphics_mhz",
         "app_memory_mhz", "app_default_memory_mhz", "util_pct")


def facts_from_nvml(gpus: list[dict[str, object]], driver: str | None) -> ClockFacts:
    """The NVML probe's GPU dicts (nvml_probe._limits keys) as ClockFacts."""
    out = []
    for gpu in gpus:
        mask = gpu.get("clocks_event_reasons")
        reasons = [name for bit, name in REASON_BITS.items()
                   if isinstance(mask, int) and mask & bit]
        row = {k: (float(gpu[k]) if isinstance(gpu.get(k), (int, float)) else None)
               for k in _KEYS}
        out.append({"index": gpu.get("index"), "bus_id": gpu.get("bus_id"), **row,
                    "pstate": None, "reasons": reasons})
    return ClockFacts(out, driver, None)


def collect(expect: dict, timeout: float) -> ClockFacts:
    """NVML (in its child process) where the site's ``gpu_source`` reads NVML, else one
    ``nvidia-smi -q -d POWER,CLOCK,PERFORMANCE,UTILIZATION`` under the deadline."""
    import importlib.util

    from slurmfabric.health.checks import gpu

    source = str(expect.get("gpu_source", "auto"))
    if source in ("auto", "nvml") and importlib.util.find_spec("pynvml") is not None:
        facts = gpu.collect_nvml(timeout)
        if facts is not None:
            return facts_from_nvml(facts.gpus, facts.driver)
    path = str(expect.get("nvidia_smi") or "/usr/bin/nvidia-smi")
    return facts_from_text(gpu.run_nvsmi(path, Q_ARGS, timeout))


# --- the check (pure) -----------------------------------------------------------------------


def _fmt(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_clocks(facts: ClockFacts, expect: dict, ctx) -> CheckResult:
    """Fail a GPU whose enforced power limit is below its default (beyond the tolerance),
    whose application clocks are set below their default, or whose SM clock is below
    ``sm_clock_min_ratio`` of its maximum while busy with a limiter other than Idle set.
    Idle GPUs downclock legitimately: an idle GPU's clock is never judged."""
    tolerance = float(expect.get("power_limit_tolerance", 0.05))
    busy = float(expect.get("busy_util_pct", 80))
    ratio = float(expect.get("sm_clock_min_ratio", 0.5))
    bad, note, values, metrics = [], [], {}, []
    gpus = facts.gpus if ctx.job_gpus is None else [
        g for g in facts.gpus if g["index"] in ctx.job_gpus]
    for gpu in gpus:
        label = f"GPU{gpu['index']} {gpu['bus_id']}"
        labels = (("gpu", str(gpu["index"])),)
        values[f"GPU{gpu['index']}"] = {k: v for k, v in gpu.items()
                                        if k not in ("index",) and v not in (None, [])}
        for key, name in (("power_enforced_w", "slurmfabric_gpu_power_limit_watts"),
                          ("power_default_w", "slurmfabric_gpu_power_default_limit_watts"),
                          ("sm_mhz", "slurmfabric_gpu_sm_clock_mhz"),
                          ("sm_max_mhz", "slurmfabric_gpu_sm_clock_max_mhz"),
                          ("app_graphics_mhz", "slurmfabric_gpu_applications_clock_mhz")):
            if gpu.get(key) is not None:
                metrics.append(Metric(name, float(gpu[key]), labels))
        enforced, default = gpu["power_enforced_w"], gpu["power_default_w"]
        requested = gpu["power_requested_w"]
        if enforced is not None and default and enforced < default * (1 - tolerance):
            who = (f"requested {_fmt(requested)} W (nvidia-smi -pl)" if requested is not None
                   and requested < default * (1 - tolerance) else
                   f"requested {_fmt(requested)} W; capped outside the driver: BMC or firmware"
                   if requested is not None else "")
            bad.append(f"{label} power limit {_fmt(enforced)} W below its default "
                       f"{_fmt(default)} W" + (f" ({who})" if who else ""))
        for kind in ("graphics", "memory"):
            app, app_default = gpu[f"app_{kind}_mhz"], gpu[f"app_default_{kind}_mhz"]
            if app is not None and app_default and app < app_default:
                bad.append(f"{label} applications {kind} clock {_fmt(app)} MHz below its "
                           f"default {_fmt(app_default)} MHz (nvidia-smi -rac resets it)")
        sm, sm_max, util = gpu["sm_mhz"], gpu["sm_max_mhz"], gpu["util_pct"]
        limiters = [r for r in gpu["reasons"] if r != IDLE]
        if (sm is not None and sm_max and util is not None and util >= busy
                and sm < sm_max * ratio and limiters):
            bad.append(f"{label} SM clock {_fmt(sm)} MHz of {_fmt(sm_max)} MHz at "
                       f"{_fmt(util)}% utilization ({', '.join(limiters)})")
    if gpus and all(g["power_enforced_w"] is None and g["sm_mhz"] is None for g in gpus):
        # Older boards and some drivers print N/A: nothing to judge, said, not warned.
        note.append("this nvidia-smi reports no power limits or clocks: not judged")
    return CheckResult("gpu.clocks", FAIL if bad else OK, "; ".join(bad or note), values,
                       tuple(metrics))


# name -> (function, default on_error, hooks). Fact key "gpu_clocks". The epilog is left
# out: a job's own -ac/-pl changes are judged when the next prolog runs.
CHECKS = {
    "gpu.clocks": (check_clocks, "pass", ("prolog", "check", "periodic")),
}



FAMILY = Family("clocks", keys={  # gpu.clocks: power and clocks against the GPU's own limits
    "power_limit_tolerance": Key(0.05, (0.0, 1.0)),  # enforced limit this far below default
    "busy_util_pct": Key(80, (0, 100)),  # a GPU this busy ...
    "sm_clock_min_ratio": Key(0.5, (0.0, 1.0)),  # ... with its SM clock below this share
}, facts=(Fact("gpu_clocks", lambda run, t: collect(run.expect, t), CHECKS, gate=gathered),))
