"""GPU facts (NVML, else nvidia-smi CSV queries) and the GPU checks over them.

Facts are gathered once per run into one list of per-GPU dicts with the same keys whatever
the source, so every check is a pure function of that list (tested with recorded output).
NVML runs in a child process (``slurmfabric.health.nvml_probe``) so a wedged driver can only
hang that child, never the hook.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
import threading
from dataclasses import dataclass

from slurmfabric._common.probe import ProbeError, run_command
from slurmfabric.health.family import Fact, Family, Gathering, Key
from slurmfabric.health.model import FAIL, OK, WARN, CheckResult, Metric

# nvidia-smi --query-gpu fields -> our keys. The throttle field was renamed in 535.54.03.
GPU_FIELDS = {
    "index": "index",
    "uuid": "uuid",
    "name": "name",
    "pci.bus_id": "bus_id",
    "driver_version": "driver",
    "temperature.gpu": "temp_c",
    "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected",
    "retired_pages.single_bit_ecc.count": "retired_sbe",
    "retired_pages.double_bit.count": "retired_dbe",
    "retired_pages.pending": "retired_pending",
    "pcie.link.gen.current": "pcie_gen",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.width.current": "pcie_width",
    "pcie.link.width.max": "pcie_width_max",
}
EVENT_FIELD = "clocks_event_reasons.active"
THROTTLE_FIELD = "clocks_throttle_reasons.active"  # before driver 535.54.03
REMAP_FIELDS = {
    "gpu_bus_id": "bus_id",
    "remapped_rows.uncorrectable": "remap_uncorrectable",
    "remapped_rows.pending": "remap_pending",
    "remapped_rows.failure": "remap_failure",
}
APP_FIELDS = {"gpu_bus_id": "bus_id", "pid": "pid", "process_name": "process"}

# nvidia-smi(1) RETURN VALUE. The ones that mean "this node is broken" drain the node even
# when the check itself is fail-open.
EXIT_CODES = {
    2: "a supplied argument or flag is invalid",
    3: "the requested operation is not available on the target device",
    4: "no permission to access the device",
    6: "a query to find an object was unsuccessful",
    8: "a GPU's external power cables are not properly attached",
    9: "the NVIDIA driver is not loaded",
    10: "the NVIDIA kernel detected an interrupt issue with a GPU",
    12: "the NVML shared library could not be found or loaded",
    13: "the local NVML does not implement this function",
    14: "the infoROM is corrupted",
    15: "a GPU has fallen off the bus or become inaccessible",
    255: "other error or internal driver error",
}
NODE_FAULT_EXITS = {8, 9, 10, 12, 14, 15}

THROTTLE_BITS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
    0x100: "display clock setting",
}
_NA = {"[n/a]", "n/a", "[not supported]", "not supported", "", "[unknown]"}


@dataclass(frozen=True)
class GpuFacts:
    gpus: list[dict[str, object]]
    source: str  # "nvml" or "nvidia-smi"
    driver: str | None = None


# --- parsing (pure) -------------------------------------------------------------------------


def _value(text: str) -> object:
    """One CSV cell: numbers, hex bitmasks, Yes/No; N/A-like -> None; ``[...]`` errors kept."""
    text = text.strip()
    low = text.lower()
    if low in _NA:
        return None
    if low in ("yes", "true", "enabled", "active"):
        return True
    if low in ("no", "false", "disabled", "not active"):
        return False
    if low.startswith("0x"):
        try:
            return int(low, 16)
        except ValueError:
            return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text  # strings (names, bus ids) and errors like "[GPU requires reset]"


def parse_csv(text: str, fields: dict[str, str], what: str) -> list[dict[str, object]]:
    """Parse ``--format=csv,nounits`` output with its header; map columns to our keys.

    The header is checked against the fields asked for (units like `` [MiB]`` stripped), and
    a row with the wrong number of cells is an error, never an index past the end.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ProbeError(f"nvidia-smi {what}: empty output")
    rows = list(csv.reader(lines, skipinitialspace=True))
    header = [cell.split(" [")[0].strip() for cell in rows[0]]
    keys = []
    for name in header:
        if name not in fields:
            raise ProbeError(f"nvidia-smi {what}: unexpected column {name!r} in {lines[0]!r}")
        keys.append(fields[name])
    out = []
    for row, line in zip(rows[1:], lines[1:]):
        if len(row) != len(keys):
            raise ProbeError(f"nvidia-smi {what}: {len(row)} cells, expected {len(keys)}: {line!r}")
        out.append({key: _value(cell) for key, cell in zip(keys, row)})
    return out


def normal_bus_id(bus_id: object) -> str:
    """Normalise ``00000000:18:00.0`` / ``0000:18:00.0`` to ``0000:18:00.0`` (lower case)."""
    text = str(bus_id).strip().lower()
    domain, _, rest = text.partition(":")
    return f"{domain[-4:]}:{rest}" if rest else text


def merge(gpus: list[dict[str, object]], remaps: list[dict[str, object]] | None,
          apps: list[dict[str, object]] | None) -> list[dict[str, object]]:
    """Join remapped-rows and compute-apps rows onto GPUs by PCI bus id."""
    by_bus = {normal_bus_id(g.get("bus_id")): g for g in gpus}
    for gpu in gpus:
        gpu.setdefault("procs", [])
    for row in remaps or []:
        target = by_bus.get(normal_bus_id(row.get("bus_id")))
        if target is not None:
            target.update({k: v for k, v in row.items() if k != "bus_id"})
    for row in apps or []:
        target = by_bus.get(normal_bus_id(row.get("bus_id")))
        if target is not None and row.get("pid") is not None:
            target["procs"].append({"pid": row["pid"], "process": row.get("process")})
    return gpus


# --- collection -----------------------------------------------------------------------------


def run_nvsmi(path: str, args: list[str], timeout: float) -> str:
    """One nvidia-smi call under a deadline; a failing exit is a ProbeError naming it (and a
    node fault for the exits in NODE_FAULT_EXITS). Shared by the GPU and NVLink probes."""
    out = run_command([path, *args], timeout, name="nvidia-smi")
    if out.returncode != 0:
        meaning = EXIT_CODES.get(out.returncode, "unknown exit code")
        detail = (out.stdout.strip() or out.stderr.strip()).splitlines()
        first = f": {detail[0]}" if detail else ""
        raise ProbeError(
            f"nvidia-smi exit {out.returncode} ({meaning}){first}",
            node_fault=out.returncode in NODE_FAULT_EXITS,
        )
    return out.stdout


def query_gpus(path: str, timeout: float) -> list[dict[str, object]]:
    """``--query-gpu`` with the new throttle field name, retrying with the old one."""
    fields = dict(GPU_FIELDS)
    for name in (EVENT_FIELD, THROTTLE_FIELD):
        wanted = {**fields, name: "clocks_event_reasons"}
        try:
            text = run_nvsmi(path, [f"--query-gpu={','.join(wanted)}", "--format=csv,nounits"],
                          timeout)
        except ProbeError as exc:
            if name == EVENT_FIELD and "not a valid field" in str(exc):
                continue  # driver older than 535.54.03
            raise
        return parse_csv(text, wanted, "--query-gpu")
    raise ProbeError("nvidia-smi accepts neither clocks_event_reasons nor clocks_throttle_reasons")


def collect_nvidia_smi(path: str, timeout: float, apps: bool = True) -> GpuFacts:
    """The queries run concurrently; remapped rows and apps are optional extras (``apps``
    False skips the compute-apps query: the periodic check does not judge processes)."""
    results: dict[str, object] = {}

    def one(key: str, args: list[str], fields: dict[str, str]) -> None:
        try:
            results[key] = parse_csv(run_nvsmi(path, args, timeout), fields, args[0].split("=")[0])
        except ProbeError as exc:
            results[key] = exc

    threads = [
        threading.Thread(target=one, daemon=True, args=(
            "remap", [f"--query-remapped-rows={','.join(REMAP_FIELDS)}", "--format=csv,nounits"],
            REMAP_FIELDS)),
    ]
    if apps:
        threads.append(threading.Thread(target=one, daemon=True, args=(
            "apps", [f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,nounits"],
            APP_FIELDS)))
    for thread in threads:
        thread.start()
    gpus = query_gpus(path, timeout)
    for thread in threads:
        thread.join(timeout + 0.5)
    remap, procs = results.get("remap"), results.get("apps")
    for gpu in gpus:
        if isinstance(remap, ProbeError):
            gpu["remap_error"] = str(remap)
        if isinstance(procs, ProbeError):
            gpu["procs_error"] = str(procs)
    merged = merge(gpus, remap if isinstance(remap, list) else None,
                   procs if isinstance(procs, list) else None)
    driver = str(gpus[0].get("driver")) if gpus else None
    return GpuFacts(merged, "nvidia-smi", driver)


def collect_nvml(timeout: float) -> GpuFacts | None:
    """NVML in a child process; None when NVML is not installed (library or module)."""
    cmd = [sys.executable, "-m", "slurmfabric.health.nvml_probe"]
    out = run_command(cmd, timeout, name="NVML probe")
    try:
        data = json.loads(out.stdout)
    except ValueError as exc:
        raise ProbeError(f"NVML probe printed no JSON (exit {out.returncode}): "
                         f"{(out.stderr or out.stdout).strip()[-200:]}") from exc
    if data.get("missing"):
        return None
    if data.get("error"):
        raise ProbeError(f"NVML: {data['error']}", node_fault=bool(data.get("node_fault")))
    return GpuFacts(data["gpus"], "nvml", data.get("driver"))


def collect(expect: dict[str, object], timeout: float, apps: bool = True) -> GpuFacts:
    """Facts from the configured source: ``auto`` tries NVML, then nvidia-smi."""
    source = str(expect.get("gpu_source", "auto"))
    path = str(expect.get("nvidia_smi") or "/usr/bin/nvidia-smi")
    if source in ("auto", "nvml"):
        facts = None
        if importlib.util.find_spec("pynvml") is not None:
            facts = collect_nvml(timeout)
        if facts is not None:
            return facts
        if source == "nvml":
            raise ProbeError("NVML requested but not available (install nvidia-ml-py and the "
                             "driver's libnvidia-ml.so.1)")
    return collect_nvidia_smi(path, timeout, apps)


# --- checks (pure functions of the facts) ---------------------------------------------------


def _label(gpu: dict[str, object]) -> str:
    return f"GPU{gpu.get('index')}"


def _scope(facts: GpuFacts, ctx) -> list[dict[str, object]]:
    """The job's GPUs on a shared node (SLURM_JOB_GPUS), else all of them."""
    if ctx.job_gpus is None:
        return facts.gpus
    return [g for g in facts.gpus if g.get("index") in ctx.job_gpus]


def _result(name: str, bad: list[str], warn: list[str], values: dict, metrics=()) -> CheckResult:
    if bad:
        return CheckResult(name, FAIL, "; ".join(bad), values, tuple(metrics))
    if warn:
        return CheckResult(name, WARN, "; ".join(warn), values, tuple(metrics))
    return CheckResult(name, OK, "", values, tuple(metrics))


def check_count(facts: GpuFacts, expect: dict, ctx) -> CheckResult:
    want = expect.get("gpus")
    have = len(facts.gpus)
    bad = [f"{have} GPUs visible, expected {want}"] if want is not None and have != want else []
    for gpu in facts.gpus:  # a cell like "[GPU requires reset]" or "[Unknown Error]"
        errors = [f"{k}={v}" for k, v in gpu.items()
                  if isinstance(v, str) and v.startswith("[") and k not in ("name",)]
        if errors:
            bad.append(f"{_label(gpu)} {gpu.get('bus_id')}: {', '.join(errors)}")
    metric = Metric("slurmfabric_gpu_count", have)
    return _result("gpu.count", bad, [], {"gpus": have, "expected": want,
                                          "source": facts.source, "driver": facts.driver},
                   [metric])


def _numeric(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_ecc(facts: GpuFacts, expect: dict, ctx) -> CheckResult:
    bad, values, metrics = [], {}, []
    for gpu in _scope(facts, ctx):
        count = _numeric(gpu.get("ecc_uncorrected"))
        values[_label(gpu)] = count
        if count is not None:
            metrics.append(Metric("slurmfabric_gpu_ecc_uncorrected_volatile", count,
                                  (("gpu", str(gpu.get("index"))),)))
            if count > 0:
                bad.append(f"{_label(gpu)} {count} uncorrected volatile ECC errors")
    return _result("gpu.ecc", bad, [], values, metrics)


def check_row_remap(facts: GpuFacts, expect: dict, ctx) -> CheckResult:
    bad, warn, values = [], [], {}
    for gpu in _scope(facts, ctx):
        if gpu.get("remap_error"):
            warn.append(f"remapped rows unreadable: {gpu['remap_error']}")
            break
        pending, failed = gpu.get("remap_pending"), gpu.get("remap_failure")
        values[_label(gpu)] = {"pending": pending, "failure": failed}
        if failed in (True, 1):
            bad.append(f"{_label(gpu)} row remapping failed")
        elif pending in (True, 1):
            bad.append(f"{_label(gpu)} row remap pending (GPU reset needed)")
    return _result("gpu.row_remap", bad, warn, values)


def check_retired_pages(facts: GpuFacts, expect: dict, ctx) -> CheckResult:
    bad, values = [], {}
    limit = int(expect.get("retired_pages_max") or 60)
    for gpu in _scope(facts, ctx):
        total = sum(_numeric(gpu.get(k)) or 0 for k in ("retired_sbe", "retired_dbe"))
        values[_label(gpu)] = total
        if gpu.get("retired_pending") is True:
            bad.append(f"{_label(gpu)} page retirement pending (reboot needed)")
        elif total >= limit:
            bad.append(f"{_label(gpu)} {total} retired pages (limit {limit})")
    return _result("gpu.retired_pages", bad, [], values)


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def check_throttle(facts: GpuFacts, expect: dict, ctx) -> CheckResult:
    bad, warn, values, metrics = [], [], {}, []
    fail_mask = int(expect.get("throttle_fail_mask") or 0)
    warn_mask = int(expect.get("throttle_warn_mask") or 0)
    for gpu in _scope(facts, ctx):
        mask = _numeric(gpu.get("clocks_event_reasons"))
        values[_label(gpu)] = None if mask is None else hex(mask)
        if mask is None:
            continue
        metrics.append(Metric("slurmfabric_gpu_clocks_event_reasons", mask,
                              (("gpu", str(gpu.get("index"))),)))
        if mask & fail_mask:
            bad.append(f"{_label(gpu)} {', '.join(throttle_names(mask & fail_mask))}")
        elif mask & warn_mask:
            warn.append(f"{_label(gpu)} {', '.join(throttle_names(mask & warn_mask))}")
    return _result("gpu.throttle", bad, warn, values, metrics)


def check_temperature(facts: GpuFacts, expect: dict, ctx) -> CheckResult:
    bad, warn, values, metrics = [], [], {}, []
    high, soft = expect.get("gpu_max_temp_c"), expect.get("gpu_warn_temp_c")
    for gpu in _scope(facts, ctx):
        temp = gpu.get("temp_c")
        values[_label(gpu)] = temp
        if not isinstance(temp, (int, float)) or isinstance(temp, bool):
            continue
        metrics.append(Metric("slurmfabric_gpu_temperature_celsius", temp,
                              (("gpu", str(gpu.get("index"))),)))
        if high is not None and temp >= high:
            bad.append(f"{_label(gpu)} at {temp} C (limit {high} C)")
        elif soft is not None and temp >= soft:
            warn.append(f"{_label(gpu)} at {temp} C (warn {soft} C)")
    return _result("gpu.temperature", bad, warn, values, metrics)


def check_pcie(facts: GpuFacts, expect: dict, ctx) -> CheckResult:
    """Width is judged strictly. Idle GPUs downshift the link speed, so the current
    generation is only reported (a warning in deep checks); the link's maximum generation
    (what GPU and slot can negotiate) must reach the configured ``pcie_gen``."""
    bad, warn, values, metrics = [], [], {}, []
    for gpu in _scope(facts, ctx):
        width, gen = _numeric(gpu.get("pcie_width")), _numeric(gpu.get("pcie_gen"))
        gen_max = _numeric(gpu.get("pcie_gen_max"))
        want_width = expect.get("pcie_width") or _numeric(gpu.get("pcie_width_max"))
        want_gen = expect.get("pcie_gen") or gen_max
        values[_label(gpu)] = f"Gen{gen}/{gen_max} x{width}"
        labels = (("gpu", str(gpu.get("index"))),)
        if width is not None:
            metrics.append(Metric("slurmfabric_gpu_pcie_link_width", width, labels))
        if gen is not None:
            metrics.append(Metric("slurmfabric_gpu_pcie_link_gen", gen, labels))
        if width is not None and want_width and width < want_width:
            bad.append(f"{_label(gpu)} PCIe x{width}, expected x{want_width}")
        if gen_max is not None and expect.get("pcie_gen") and gen_max < expect["pcie_gen"]:
            bad.append(f"{_label(gpu)} PCIe link max Gen{gen_max}, expected Gen{want_gen}")
        elif ctx.deep and gen is not None and want_gen and gen < want_gen:
            warn.append(f"{_label(gpu)} PCIe running at Gen{gen}, expected Gen{want_gen}")
    return _result("gpu.pcie", bad, warn, values, metrics)


def check_processes(facts: GpuFacts, expect: dict, ctx) -> CheckResult:
    """Before a job the (job's) GPUs must be free; after it, nothing may be left on them."""
    bad, values = [], {}
    for gpu in _scope(facts, ctx):
        if gpu.get("procs_error"):
            return CheckResult("gpu.processes", WARN, f"compute apps unreadable: "
                               f"{gpu['procs_error']}")
        procs = gpu.get("procs") or []
        values[_label(gpu)] = [p["pid"] for p in procs]
        if procs:
            shown = ", ".join(f"{p['pid']} ({p.get('process')})" for p in procs[:3])
            when = "after the job" if ctx.hook.startswith("epilog") else "before the job"
            bad.append(f"{_label(gpu)} held {when} by pid {shown}")
    return _result("gpu.processes", bad, [], values)


def enabled(expect: dict) -> bool:
    """GPU checks run when GPUs are expected, or (unset) when a GPU tool exists."""
    want = expect.get("gpus")
    if want is not None:
        return int(want) > 0
    import os

    return os.path.exists(str(expect.get("nvidia_smi"))) or os.path.exists("/dev/nvidiactl")


# Which hooks run a check by default. The periodic HealthCheckProgram also runs on allocated
# nodes, so nothing that a running job changes (its processes, its memory) is judged there.
ALL_HOOKS = ("prolog", "epilog", "check", "periodic")
JOB_HOOKS = ("prolog", "epilog", "check")

# name -> (function, default on_error, hooks). Fact key "gpu".
CHECKS = {
    "gpu.count": (check_count, "fail", ALL_HOOKS),
    "gpu.ecc": (check_ecc, "fail", ALL_HOOKS),
    "gpu.row_remap": (check_row_remap, "fail", ALL_HOOKS),
    "gpu.retired_pages": (check_retired_pages, "fail", ALL_HOOKS),
    "gpu.throttle": (check_throttle, "fail", ALL_HOOKS),
    "gpu.temperature": (check_temperature, "fail", ALL_HOOKS),
    "gpu.pcie": (check_pcie, "fail", ALL_HOOKS),
    "gpu.processes": (check_processes, "fail", JOB_HOOKS),
}


def gathered(run: Gathering) -> bool:
    """The gate of every NVIDIA GPU fact: GPUs expected, or a GPU tool present."""
    return run.once("gpu.enabled", lambda: enabled(run.expect))


FAMILY = Family("gpu", keys={
    "gpus": Key(None, (0, 1024), integer=True),  # None: check GPUs only if nvidia-smi/NVML
    #                                              exists; 0: no GPU checks
    "gpu_source": Key("auto", choices=("auto", "nvml", "nvidia-smi")),  # auto: NVML, else smi
    "nvidia_smi": Key("/usr/bin/nvidia-smi"),
    "gpu_max_temp_c": Key(87, (0, 150)),
    "gpu_warn_temp_c": Key(80, (0, 150)),
    "pcie_gen": Key(None, (1, 7), integer=True),  # None: the GPU's own pcie.link.gen.max
    "pcie_width": Key(None, (1, 32), integer=True),  # None: pcie.link.width.max
    "retired_pages_max": Key(60, (0, None), integer=True),
    "throttle_fail_mask": Key(0x8 | 0x40 | 0x80, (0, None), integer=True),  # HW slowdown,
    #                                                      HW thermal, power brake
    "throttle_warn_mask": Key(0x20, (0, None), integer=True),  # SW thermal
}, facts=(Fact("gpu", lambda run, t: collect(run.expect, t, "gpu.processes" in run.active),
               CHECKS, gate=gathered),))
