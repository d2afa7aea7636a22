"""NVLink and NVSwitch checks: links up at speed, error counters per job, the fabric.

- ``gpu.nvlink``: every GPU has its expected NVLinks active, at the expected speed
  (``nvidia-smi nvlink -s``). A link that trained down or is ``<inactive>`` halves a GPU's
  share of all-reduce bandwidth without any error.
- ``gpu.nvlink_errors``: Replay, Recovery and CRC counters (``nvidia-smi nvlink -e``) as
  deltas between this job's prolog and its epilog, the way ``rdma.counters`` judges ports;
  the counters only grow until the driver reloads, so without a snapshot only absolute limits
  the site sets apply.
- ``gpu.fabric``: on boards with NVSwitches (HGX A100/H100/H200: PCI vendor 0x10de, class
  0x0680), Fabric Manager must run and every GPU's fabric registration must read
  ``State: Completed`` with ``Status: Success`` (the "Fabric" block of ``nvidia-smi -q``;
  NVIDIA Fabric Manager user guide, https://docs.nvidia.com/datacenter/tesla/fabric-manager-
  user-guide/). Without it every CUDA call fails with error 802 "system not yet
  initialized". HGX B200/GB200 switches are not PCI devices of the host: set ``nvswitch =
  true`` there. Drivers older than the Fabric block make the check warn, not drain.

Output formats are those of the recorded captures in tests/fixtures/health/nvlink/ (sources
in its SOURCES.md). Standard library only: this runs in the prolog.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field

from slurmfabric._common.probe import ProbeError
from slurmfabric.health.checks.gpu import gathered, normal_bus_id, run_nvsmi
from slurmfabric.health.family import Fact, Family, Gathering, Key
from slurmfabric.health.model import FAIL, OK, WARN, CheckResult, Metric

_GPU = re.compile(r"GPU (?P<index>[0-9]{1,4}): ")  # then the name, then " (UUID: ...)"
_LINK = re.compile(r"^Link (?P<link>[0-9]{1,3}): (?P<rest>.*)$")
_SPEED = re.compile(r"^(?P<speed>[0-9]+(?:\.[0-9]+)?) GB/s$")
_COUNTER = re.compile(r"^(?P<name>[A-Za-z ]{1,40}) Errors: (?P<value>[0-9]{1,20})$")
COUNTERS = {"Replay": "replay", "Recovery": "recovery", "CRC": "crc"}
# Allowed increase during one job. A recovery is a link retraining, never normal in a job;
# replays and CRC errors are corrected by the link layer but a burst means a marginal link.
DEFAULT_DELTA_MAX = {"replay": 100, "recovery": 0, "crc": 100}
NVSWITCH_CLASS = "0x0680"  # PCI "bridge, other"; with vendor 0x10de an NVSwitch
FABRIC_MANAGER = ("nv-fabricmanager", "nv-fabricmanage")  # comm is cut to 15 characters


@dataclass(frozen=True)
class NvlinkFacts:
    """Per GPU index: link -> speed in GB/s (None: inactive), and link -> counters."""

    links: dict[int, dict[int, float | None]]
    names: dict[int, str] = field(default_factory=dict)
    counters: dict[int, dict[int, dict[str, int]]] | None = None
    counters_error: str = ""


@dataclass(frozen=True)
class FabricFacts:
    switches: list[str]  # PCI addresses of the NVSwitches (empty with ``nvswitch = true``)
    manager: bool  # a Fabric Manager process runs
    gpus: dict[str, dict[str, str]]  # bus id -> Fabric fields (State, Status, Summary ...)
    has_fabric_block: bool  # the driver prints a Fabric block at all


# --- parsing (pure) -------------------------------------------------------------------------


def _blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """``GPU N: name (UUID: ...)`` headers and the stripped lines under each."""
    blocks: list[tuple[int, str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()  # a tab and a space in raw output, spaces in pasted copies
        match = _GPU.match(line)
        if match:
            name = line[match.end():].rpartition(" (UUID: ")
            blocks.append((int(match.group("index")), (name[0] if name[1] else name[2]).strip(),
                           []))
        elif line and blocks:
            blocks[-1][2].append(line)
    return blocks


def parse_status(text: str) -> tuple[dict[int, dict[int, float | None]], dict[int, str]]:
    """``nvidia-smi nvlink -s``: per GPU, link -> GB/s or None for ``<inactive>``. A GPU
    whose links are all down prints "all links are inActive" and gets no links."""
    links: dict[int, dict[int, float | None]] = {}
    names: dict[int, str] = {}
    for index, name, lines in _blocks(text):
        names[index] = name
        links[index] = {}
        for line in lines:
            match = _LINK.match(line)
            if not match:
                continue
            speed = _SPEED.match(match.group("rest").strip())
            links[index][int(match.group("link"))] = float(speed.group("speed")) if speed \
                else None
    return links, names


def parse_errors(text: str) -> dict[int, dict[int, dict[str, int]]]:
    """``nvidia-smi nvlink -e``: per GPU, link -> {replay, recovery, crc}."""
    out: dict[int, dict[int, dict[str, int]]] = {}
    for index, _, lines in _blocks(text):
        gpu = out.setdefault(index, {})
        for line in lines:
            match = _LINK.match(line)
            counter = _COUNTER.match(match.group("rest").strip()) if match else None
            if counter and counter.group("name") in COUNTERS:
                key = COUNTERS[counter.group("name")]
                gpu.setdefault(int(match.group("link")), {})[key] = int(counter.group("value"))
    return out


def parse_fabric(text: str) -> dict[str, dict[str, str]]:
    """The ``Fabric`` block of each GPU in ``nvidia-smi -q``: bus id -> its fields (State,
    Status, CliqueId, ClusterUUID and, in newer drivers, Health's Summary, Bandwidth ...)."""
    out: dict[str, dict[str, str]] = {}
    bus, inside, depth = "", False, 0
    for raw in text.splitlines():
        indent = len(raw) - len(raw.lstrip())
        line = raw.strip()
        if raw.startswith("GPU ") and indent == 0:
            bus, inside = normal_bus_id(line[4:]), False
            continue
        if line == "Fabric" and bus:
            inside, depth = True, indent
            out[bus] = {}
            continue
        if inside:
            if not line or indent <= depth:
                inside = False
                continue
            key, sep, value = line.partition(":")
            if sep and value.strip():
                out[bus][key.strip()] = value.strip()
    return out


# --- collection -----------------------------------------------------------------------------


def nvswitches(root: str) -> list[str]:
    """NVSwitch PCI functions under ``root``: /sys/bus/pci/devices/*/{vendor,class}."""
    base = os.path.join(root, "sys/bus/pci/devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    found = []
    for name in names:
        try:
            with open(os.path.join(base, name, "vendor")) as handle:
                vendor = handle.read(16).strip()
            with open(os.path.join(base, name, "class")) as handle:
                klass = handle.read(16).strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass.startswith(NVSWITCH_CLASS):
            found.append(name)
    return found


def fabric_manager_running(root: str) -> bool:
    """Is an ``nv-fabricmanager`` process in ``root``/proc (its comm, cut to 15 chars)?"""
    base = os.path.join(root, "proc")
    try:
        pids = [p for p in os.listdir(base) if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(os.path.join(base, pid, "comm")) as handle:
                if handle.read(32).strip() in FABRIC_MANAGER:
                    return True
        except OSError:
            continue
    return False


def collect_links(path: str, timeout: float, counters: bool) -> NvlinkFacts:
    """``nvlink -s`` and, when a counter check runs, ``nvlink -e`` concurrently."""
    result: dict[str, object] = {}

    def errors() -> None:
        try:
            result["e"] = parse_errors(run_nvsmi(path, ["nvlink", "-e"], timeout))
        except ProbeError as exc:
            result["e"] = exc

    thread = threading.Thread(target=errors, daemon=True) if counters else None
    if thread:
        thread.start()
    links, names = parse_status(run_nvsmi(path, ["nvlink", "-s"], timeout))
    if not links:
        raise ProbeError("nvidia-smi nvlink -s listed no GPU")
    if thread:
        thread.join(timeout + 0.5)
    found = result.get("e")
    if isinstance(found, dict):
        return NvlinkFacts(links, names, found)
    why = str(found) if isinstance(found, ProbeError) else ("not asked" if not counters
                                                            else "nvlink -e did not return")
    return NvlinkFacts(links, names, None, why)


def collect_fabric(path: str, timeout: float, root: str, switches: list[str]) -> FabricFacts:
    text = run_nvsmi(path, ["-q"], timeout)
    gpus = parse_fabric(text)
    return FabricFacts(switches, fabric_manager_running(root), gpus,
                       "\n    Fabric" in text or bool(gpus))


def fabric_switches(expect: dict) -> list[str] | None:
    """The NVSwitches that make ``gpu.fabric`` apply, or None when it does not."""
    if expect.get("nvswitch") is False:
        return None
    found = nvswitches(str(expect.get("sysfs_root") or "/"))
    if found or expect.get("nvswitch") is True:
        return found
    return None


def links_enabled(expect: dict, switches: list[str] | None) -> bool:
    """NVLink checks run where links are expected: ``nvlinks`` > 0, or an NVSwitch board
    (``switches`` from ``fabric_switches``)."""
    want = expect.get("nvlinks")
    if want is not None:
        return int(want) > 0
    return switches is not None


def snapshot(facts: object) -> dict[str, dict[str, dict[str, int]]] | None:
    """The counters to keep in the job's state file (JSON keys are strings)."""
    if not isinstance(facts, NvlinkFacts) or facts.counters is None:
        return None
    return {str(g): {str(k): dict(v) for k, v in links.items()}
            for g, links in facts.counters.items()}


# --- checks (pure functions of the facts) ---------------------------------------------------


def _scope(indices, ctx) -> list[int]:
    jobs = getattr(ctx, "job_gpus", None)
    return sorted(i for i in indices if jobs is None or i in jobs)


def check_links(facts: NvlinkFacts, expect: dict, ctx) -> CheckResult:
    """Expected active links per GPU (``nvlinks``, else as many as the best GPU has) at the
    expected speed (``nvlink_speed_gbps``, else the fastest link seen)."""
    active = {g: {k: s for k, s in links.items() if s is not None}
              for g, links in facts.links.items()}
    want = expect.get("nvlinks")
    want = int(want) if want is not None else max((len(a) for a in active.values()), default=0)
    speeds = [s for a in active.values() for s in a.values()]
    speed = expect.get("nvlink_speed_gbps") or (max(speeds) if speeds else None)
    bad, values, metrics = [], {}, []
    for index in _scope(facts.links, ctx):
        links = active[index]
        values[f"GPU{index}"] = len(links)
        metrics.append(Metric("slurmfabric_gpu_nvlink_active_links", len(links),
                              (("gpu", str(index)),)))
        down = sorted(k for k, s in facts.links[index].items() if s is None)
        if len(links) < want:
            what = f"links {','.join(map(str, down))} inactive" if down else (
                "all links inactive" if not links else f"only {len(links)} links listed")
            bad.append(f"GPU{index} {len(links)}/{want} NVLinks active ({what})")
        slow = sorted(k for k, s in links.items() if speed and s < float(speed) * 0.99)
        if slow:
            bad.append(f"GPU{index} NVLink {','.join(map(str, slow))} at "
                       f"{min(links[k] for k in slow):g} GB/s, expected {float(speed):g} GB/s")
    values.update({"expected_links": want, "expected_gbps": speed})
    status = FAIL if bad else OK
    return CheckResult("gpu.nvlink", status, "; ".join(bad[:4]), values, tuple(metrics))


def _count(before: dict, gpu: str, link: str, name: str) -> int | None:
    """One counter of the prolog's snapshot; None when the state file lacks or garbles it."""
    try:
        value = before[gpu][link][name]
    except (KeyError, TypeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_errors(facts: NvlinkFacts, expect: dict, ctx) -> CheckResult:
    """Counter growth during the job (prolog snapshot to epilog); without a snapshot only
    the site's ``nvlink_abs_max`` applies (the counters count since the driver loaded)."""
    if facts.counters is None:
        return CheckResult("gpu.nvlink_errors", WARN,
                           f"NVLink error counters unreadable: {facts.counters_error}")
    before = getattr(ctx, "nvlink_before", None)
    limits = {**DEFAULT_DELTA_MAX, **(expect.get("nvlink_delta_max") or {})}
    absolute = expect.get("nvlink_abs_max") or {}
    bad, metrics, totals = [], [], {}
    for index in _scope(facts.counters, ctx):
        for link, counts in sorted(facts.counters[index].items()):
            for name, value in counts.items():
                totals[name] = totals.get(name, 0) + value
                labels = (("gpu", str(index)), ("link", str(link)), ("counter", name))
                metrics.append(Metric("slurmfabric_gpu_nvlink_errors_total", value, labels))
                if isinstance(before, dict):
                    old = _count(before, str(index), str(link), name)
                    if old is not None and value - old > limits.get(name, 0):
                        bad.append(f"GPU{index} link {link} {name} +{value - old} during "
                                   f"the job (limit {limits.get(name, 0)})")
                elif name in absolute and value > absolute[name]:
                    bad.append(f"GPU{index} link {link} {name}={value} "
                               f"(limit {absolute[name]})")
    values = {"totals": totals, "snapshot": isinstance(before, dict)}
    return CheckResult("gpu.nvlink_errors", FAIL if bad else OK, "; ".join(bad[:4]), values,
                       tuple(metrics))


def check_fabric(facts: FabricFacts, expect: dict, ctx) -> CheckResult:
    """Fabric Manager running and every GPU's fabric registration Completed/Success."""
    bad, warn = [], []
    values: dict[str, object] = {"nvswitches": len(facts.switches),
                                 "fabric_manager": facts.manager}
    if not facts.manager:
        bad.append("Fabric Manager (nv-fabricmanager) is not running on an NVSwitch board: "
                   "CUDA fails with error 802")
    if not facts.has_fabric_block:
        warn.append("this driver's nvidia-smi -q has no Fabric section: registration not "
                    "checked")
    for bus, fields in sorted(facts.gpus.items()):
        state, status = fields.get("State", "N/A"), fields.get("Status", "N/A")
        values[bus] = f"{state}/{status}"
        if state in ("N/A", "Not Supported"):  # GPUs before Hopper do not register
            warn.append(f"GPU {bus} reports no fabric state ({state})")
        elif state != "Completed":
            bad.append(f"GPU {bus} fabric state {state!r}, expected 'Completed'")
        elif status != "Success":
            bad.append(f"GPU {bus} fabric status {status!r}, expected 'Success'")
        elif fields.get("Summary", "Healthy") not in ("Healthy", "N/A"):
            bad.append(f"GPU {bus} fabric health {fields['Summary']!r}")
    if bad:
        return CheckResult("gpu.fabric", FAIL, "; ".join(bad[:3]), values)
    if warn:
        return CheckResult("gpu.fabric", WARN, "; ".join(warn[:3]), values)
    return CheckResult("gpu.fabric", OK, "", values)


# name -> (function, default on_error, hooks). Fact keys "nvlink" (links and counters) and
# "fabric". An nvidia-smi that cannot report them is the checker's error (fail-open).
LINK_CHECKS = {
    "gpu.nvlink": (check_links, "pass", ("prolog", "epilog", "check", "periodic")),
    "gpu.nvlink_errors": (check_errors, "pass", ("epilog", "check")),
}
FABRIC_CHECKS = {"gpu.fabric": (check_fabric, "pass", ("prolog", "epilog", "check",
                                                        "periodic"))}



def _switches(run: Gathering) -> list[str] | None:
    """The NVSwitches of a GPU node (None: no fabric), scanned once per hook run."""
    return run.once("nvswitches", lambda: fabric_switches(run.expect) if gathered(run)
                    else None)


def _counters(run: Gathering) -> bool:
    """``nvlink -e`` runs for the counter check, and at the prolog for the epilog's deltas."""
    return "gpu.nvlink_errors" in run.active or _baseline(run)


def _baseline(run: Gathering) -> bool:
    return run.ctx.hook == "prolog" and run.cfg.policy("gpu.nvlink_errors").enabled


def _smi(run: Gathering) -> str:
    return str(run.expect["nvidia_smi"])


def _links_gate(run: Gathering) -> bool:
    return gathered(run) and links_enabled(run.expect, _switches(run))


COUNTER_NAMES = tuple(COUNTERS.values())
FAMILY = Family("nvlink", keys={
    "nvlinks": Key(None, (0, 64), integer=True),  # active NVLinks per GPU (18 on H100 SXM);
    #   None: as many as the best GPU has, checked on NVSwitch boards; 0: no NVLink checks
    "nvlink_speed_gbps": Key(None, (0.1, 1000)),  # per link (26.562 on H100); None: fastest
    "nvlink_delta_max": Key({}, kind="numbers", integer=True, names=COUNTER_NAMES,
                            names_are="an NVLink counter"),
    "nvlink_abs_max": Key({}, kind="numbers", integer=True, names=COUNTER_NAMES,
                            names_are="an NVLink counter"),
    "nvswitch": Key(None, kind="flag"),  # None: detect NVSwitch PCI devices
}, facts=(
    Fact("nvlink", lambda run, t: collect_links(_smi(run), t, _counters(run)), LINK_CHECKS,
         gate=_links_gate, baseline=_baseline, events=frozenset({"gpu.nvlink_errors"})),
    Fact("fabric", lambda run, t: collect_fabric(
        _smi(run), t, str(run.expect.get("sysfs_root") or "/"), _switches(run) or []),
        FABRIC_CHECKS, gate=lambda run: _switches(run) is not None),
))
