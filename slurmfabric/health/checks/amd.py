"""AMD Instinct GPUs: count, ECC/RAS errors, PCIe link, clocks and throttling, XGMI links.

The whole family is this file (``FAMILY``): its site keys, its facts (``collect``), its
checks (``CHECKS``) and when it runs (``enabled``).

Facts come from ``amd-smi`` (ROCm >= 6.0), read as the text it prints for people: that
layout (``GPU: N``, then indented ``KEY: value`` sections) is the same across amd-smi
releases, while ``--json`` changed its shape (units added in ROCm 6.1, ROCm/amdsmi
CHANGELOG). ``amd-smi metric`` gives ECC (``TOTAL_UNCORRECTABLE_COUNT``,
``TOTAL_DEFERRED_COUNT``, per block in ``ECC_BLOCKS``), PCIe (``WIDTH``, ``SPEED``,
``REPLAY_COUNT``), clocks (``GFX_0`` ``MAX_CLK``) and ``THROTTLE_STATUS``; ``amd-smi
topology`` the ``LINK TYPE TABLE``. Where only the older ``rocm-smi`` is installed,
``rocm-smi --showtopo`` gives the count and the XGMI links ("Link Type between two GPUs");
ECC, PCIe and clocks are then said to be unread, never passed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from slurmfabric.health.family import Fact, Family, Key
from slurmfabric.health.model import FAIL, OK, WARN, CheckResult, Metric

FACT = "amd"

# amdgpu binds Instinct and Radeon GPUs alike; display (0x03xx) and processing
# accelerator (0x12xx) classes, as topology.gpu counts them.
_AMDGPU = "/sys/bus/pci/drivers/amdgpu"


@dataclass(frozen=True)
class AmdFacts:
    tool: str  # "amd-smi" or "rocm-smi"
    gpus: dict[int, dict]  # GPU index -> amd-smi metric sections ({} with rocm-smi)
    links: dict[str, list[str]]  # GPU label -> link type to each other GPU
    sysfs_gpus: int  # GPUs amdgpu binds (the count the tool must see)
    unread: dict[str, str] = field(default_factory=dict)  # what could not be read, why


# -- parsing ---------------------------------------------------------------------------------

def parse_metric(text: str) -> dict[int, dict]:
    """``amd-smi metric`` text -> {gpu: {SECTION: {KEY: value or {...}}}}. Lines without a
    ``KEY:`` (a wrapped list such as JPEG_ACTIVITY's) are skipped."""
    gpus: dict[int, dict] = {}
    stack: list[tuple[int, dict]] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        body = line.lstrip()
        key, colon, value = body.partition(":")
        if not colon or not key or " " in key.strip():
            continue
        indent = len(line) - len(body)
        if indent == 0:
            stack = []
            index = _int(value) if key == "GPU" else None
            if index is not None:  # reports of one GPU merge
                stack = [(0, gpus.setdefault(index, {}))]
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key] = value.strip()
        else:
            child: dict = {}
            parent[key] = child
            stack.append((indent, child))
    return gpus


_LINK_TITLES = ("LINK TYPE TABLE", "Link Type between two GPUs")


def parse_link_table(text: str) -> dict[str, list[str]]:
    """The link-type table of ``amd-smi topology`` (rows and columns named by BDF, ``SELF``
    on the diagonal) or ``rocm-smi --showtopo`` (``GPU0``..., ``0`` on the diagonal) ->
    {row: [link type to every other GPU]}."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if any(title in line for title in _LINK_TITLES)), None)
    if start is None or start + 1 >= len(lines):
        return {}
    header = lines[start + 1].split()
    table: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        cells = line.split()
        if not cells or line.startswith("=") or line.rstrip().endswith(":"):
            break
        row, kinds = cells[0], cells[1:]
        if len(kinds) != len(header):
            break
        table[row] = [kind for col, kind in zip(header, kinds)
                      if col != row and kind not in ("SELF", "0")]
    return table


def _section(parent: dict, key: str) -> dict:
    """A nested section of a parsed report, {} when absent or a plain value."""
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _int(value: object) -> int | None:
    """The leading count of a value ("16", "32 GT/s"): ASCII digits, at most 18 of them
    (a counter, never "²" or a 5,000-digit string)."""
    words = str(value).split() if value is not None else []
    text = words[0] if words else ""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


# -- facts -----------------------------------------------------------------------------------

def sysfs_gpu_count(root: str) -> int:
    """GPUs amdgpu binds under ``root`` (display or processing-accelerator class)."""
    from slurmfabric._common.sysfs import list_dir, read_text

    base = os.path.join(root, _AMDGPU.lstrip("/"))
    count = 0
    for entry in list_dir(base):
        klass = read_text(os.path.join(base, entry, "class")) or ""
        if ":" in entry and klass.lower().startswith(("0x03", "0x12")):
            count += 1
    return count


def collect(expect: dict, timeout: float) -> AmdFacts:
    """amd-smi's metric and topology reports (rocm-smi's topology where amd-smi is absent),
    under one deadline of ``timeout`` seconds."""
    import time

    from slurmfabric._common.probe import ProbeError, run_command

    deadline = time.monotonic() + timeout
    root = str(expect.get("sysfs_root") or "/")
    in_sysfs = sysfs_gpu_count(root)
    amd_smi = str(expect.get("amd_smi") or FAMILY.keys["amd_smi"].default)
    rocm_smi = str(expect.get("rocm_smi") or FAMILY.keys["rocm_smi"].default)

    def run(argv: list[str], name: str) -> str:
        out = run_command(argv, max(0.05, deadline - time.monotonic()), name=name)
        if out.returncode != 0:
            last = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
            raise ProbeError(f"{name} {argv[1]} exit {out.returncode}: {last[:160]}")
        return out.stdout

    if os.path.exists(amd_smi):
        gpus = parse_metric(run([amd_smi, "metric"], "amd-smi"))
        unread: dict[str, str] = {}
        try:
            links = parse_link_table(run([amd_smi, "topology"], "amd-smi"))
        except ProbeError as exc:
            links, unread["xgmi"] = {}, str(exc)
        return AmdFacts("amd-smi", gpus, links, in_sysfs, unread)
    if os.path.exists(rocm_smi):
        links = parse_link_table(run([rocm_smi, "--showtopo"], "rocm-smi"))
        why = "rocm-smi only (no amd-smi): not read"
        return AmdFacts("rocm-smi", {}, links, in_sysfs,
                        {"ecc": why, "pcie": why, "clocks": why})
    raise ProbeError(f"neither {amd_smi} nor {rocm_smi} exists")


# -- checks ----------------------------------------------------------------------------------

def _seen(facts: AmdFacts) -> int:
    return len(facts.gpus) if facts.tool == "amd-smi" else len(facts.links)


def check_count(facts: AmdFacts, expect: dict, ctx) -> CheckResult:
    """Every GPU amdgpu binds (or ``amd_gpus``) answers the tool: a GPU that hangs or fell
    off the bus drops out of its report first."""
    want = expect.get("amd_gpus")
    want = facts.sysfs_gpus if want is None else int(want)
    seen = _seen(facts)
    values = {"seen": seen, "expected": want, "tool": facts.tool, "in_sysfs": facts.sysfs_gpus}
    metric = (Metric("slurmfabric_amd_gpus_seen", float(seen)),)
    if seen < want:
        return CheckResult("amd.count", FAIL, f"{seen} GPUs seen by {facts.tool}, expected "
                           f"{want}", values, metric)
    return CheckResult("amd.count", OK, "", values, metric)


def _unread(name: str, facts: AmdFacts, key: str) -> CheckResult | None:
    if key in facts.unread:
        return CheckResult(name, WARN, facts.unread[key], {"tool": facts.tool})
    return None


def check_ecc(facts: AmdFacts, expect: dict, ctx) -> CheckResult:
    """Uncorrectable or deferred ECC/RAS errors fail (data the GPU could not repair, or
    poison it deferred); correctable ones past ``amd_ecc_correctable_max`` warn."""
    skipped = _unread("amd.ecc", facts, "ecc")
    if skipped:
        return skipped
    limit = int(expect.get("amd_ecc_correctable_max") or 0)
    bad, warn, values, metrics = [], [], {}, []
    for index, sections in sorted(facts.gpus.items()):
        ecc = _section(sections, "ECC")
        counts = {kind: _int(ecc.get(f"TOTAL_{kind}_COUNT"))
                  for kind in ("UNCORRECTABLE", "DEFERRED", "CORRECTABLE")}
        blocks = _section(sections, "ECC_BLOCKS")
        hit = [name for name, block in blocks.items() if isinstance(block, dict)
               and ((_int(block.get("UNCORRECTABLE_COUNT")) or 0)
                    or (_int(block.get("DEFERRED_COUNT")) or 0))]
        for kind, value in counts.items():
            if value is not None:
                metrics.append(Metric("slurmfabric_amd_ecc_errors", float(value),
                                      (("gpu", str(index)), ("kind", kind.lower()))))
        serious = (counts["UNCORRECTABLE"] or 0) + (counts["DEFERRED"] or 0)
        if serious or hit:
            where = f" in {', '.join(hit)}" if hit else ""
            bad.append(f"GPU {index}: {counts['UNCORRECTABLE'] or 0} uncorrectable, "
                       f"{counts['DEFERRED'] or 0} deferred ECC errors{where}")
        corr = counts["CORRECTABLE"]
        if corr is None:  # a report with blocks only (amd-smi metric -k)
            corr = sum(_int(b.get("CORRECTABLE_COUNT")) or 0 for b in blocks.values()
                       if isinstance(b, dict))
        if corr:
            values[f"gpu{index}_correctable"] = corr
        if corr > limit:
            warn.append(f"GPU {index}: {corr} correctable ECC errors (limit {limit})")
    status = FAIL if bad else WARN if warn else OK
    return CheckResult("amd.ecc", status, "; ".join(bad + warn), values, tuple(metrics))


def check_pcie(facts: AmdFacts, expect: dict, ctx) -> CheckResult:
    """Every GPU's PCIe link as wide as ``amd_pcie_width`` (else the widest of the node): a
    link trained down to x8 halves host transfers. The speed is shown, not judged: amdgpu
    lowers it at idle (PCIe DPM, pp_dpm_pcie), so a speed below the maximum is normal."""
    skipped = _unread("amd.pcie", facts, "pcie")
    if skipped:
        return skipped
    widths, values, metrics = {}, {}, []
    for index, sections in sorted(facts.gpus.items()):
        pcie = _section(sections, "PCIE")
        width = _int(pcie.get("WIDTH"))
        replays = _int(pcie.get("REPLAY_COUNT"))
        labels = (("gpu", str(index)),)
        if width is not None:
            widths[index] = width
            metrics.append(Metric("slurmfabric_amd_pcie_width", float(width), labels))
        if replays is not None:
            metrics.append(Metric("slurmfabric_amd_pcie_replays", float(replays), labels))
        values[f"gpu{index}"] = f"x{width} {pcie.get('SPEED', '?')} replays {replays}"
    if not widths:
        return CheckResult("amd.pcie", WARN, f"{facts.tool} printed no PCIe WIDTH", values)
    want = int(expect.get("amd_pcie_width") or max(widths.values()))
    bad = [f"GPU {i}: PCIe x{w}, expected x{want}" for i, w in widths.items() if w < want]
    return CheckResult("amd.pcie", FAIL if bad else OK, "; ".join(bad), values,
                       tuple(metrics))


def check_clocks(facts: AmdFacts, expect: dict, ctx) -> CheckResult:
    """A GPU whose graphics clock ceiling (GFX_0 MAX_CLK) is below the node's others was
    capped (``amd-smi set --clk-limit``, a firmware limit): every collective waits for it.
    ``THROTTLE_STATUS: THROTTLED`` warns: amd-smi itself calls it not reliably supported
    (ROCm/amdsmi CHANGELOG, 6.2: removed from ``amd-smi monitor``)."""
    skipped = _unread("amd.clocks", facts, "clocks")
    if skipped:
        return skipped
    ceilings, values, throttled = {}, {}, []
    for index, sections in sorted(facts.gpus.items()):
        clock = _section(sections, "CLOCK")
        gfx = _section(clock, "GFX_0")
        top = _int(gfx.get("MAX_CLK"))
        if top:
            ceilings[index] = top
            values[f"gpu{index}_gfx_max_mhz"] = top
        power = _section(sections, "POWER")
        state = str(power.get("THROTTLE_STATUS") or "")
        if state and state not in ("UNTHROTTLED", "N/A"):
            throttled.append(f"GPU {index} {state}")
    bad = []
    if ceilings:
        best = max(ceilings.values())
        bad = [f"GPU {i}: GFX max clock {c} MHz, others {best} MHz"
               for i, c in ceilings.items() if c < best]
    status = FAIL if bad else WARN if throttled else OK
    return CheckResult("amd.clocks", status, "; ".join(bad + throttled), values)


def check_xgmi(facts: AmdFacts, expect: dict, ctx) -> CheckResult:
    """Each GPU reaches as many peers over XGMI as the best-connected GPU of the node (all
    others on an 8-GPU MI300X platform): a GPU whose XGMI link is down talks to them over
    PCIe, at a fraction of the bandwidth."""
    skipped = _unread("amd.xgmi", facts, "xgmi")
    if skipped:
        return skipped
    if not facts.links:
        return CheckResult("amd.xgmi", OK, f"{facts.tool} printed no link-type table",
                           {"tool": facts.tool})
    counts = {row: sum(kind == "XGMI" for kind in kinds) for row, kinds in facts.links.items()}
    best = max(counts.values())
    bad = [f"{row}: {n} XGMI links, others {best}" for row, n in counts.items() if n < best]
    metrics = tuple(Metric("slurmfabric_amd_xgmi_links", float(n), (("gpu", row),))
                    for row, n in counts.items())
    return CheckResult("amd.xgmi", FAIL if bad else OK, "; ".join(bad),
                       {"xgmi_links": counts}, metrics)


def enabled(expect: dict) -> bool:
    """Runs when AMD GPUs are expected, or (unset) when amdgpu binds one."""
    want = expect.get("amd_gpus")
    if want is not None:
        return int(want) > 0
    return sysfs_gpu_count(str(expect.get("sysfs_root") or "/")) > 0


_HOOKS = ("prolog", "epilog", "check", "periodic")
CHECKS = {
    "amd.count": (check_count, "fail", _HOOKS),
    "amd.ecc": (check_ecc, "fail", _HOOKS),
    "amd.pcie": (check_pcie, "pass", _HOOKS),
    "amd.clocks": (check_clocks, "pass", _HOOKS),
    "amd.xgmi": (check_xgmi, "pass", _HOOKS),
}

FAMILY = Family("amd", keys={  # docs/health.md, "AMD GPUs"
    "amd_gpus": Key(None, (0, 1024), integer=True),  # None: as many as amdgpu binds; 0: none
    "amd_smi": Key("/opt/rocm/bin/amd-smi"),
    "rocm_smi": Key("/opt/rocm/bin/rocm-smi"),  # used only where amd-smi is absent
    "amd_pcie_width": Key(None, (1, 32), integer=True),  # None: the widest link seen
    "amd_ecc_correctable_max": Key(100, (0, None), integer=True),  # per GPU, then a warning
}, facts=(Fact(FACT, lambda run, t: collect(run.expect, t), CHECKS,
               gate=lambda run: enabled(run.expect)),))
