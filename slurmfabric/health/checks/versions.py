"""Driver, CUDA, VBIOS, HCA firmware, OFED, kernel and NCCL versions: pinned and alike.

One node with another driver or HCA firmware is a classic slow-node cause, and nothing
else here judges versions (NHC's inventory checks do the same). ``collect`` reads this
node's inventory cheaply, each source fail-open:

- driver and CUDA: the header of ``nvidia-smi -q -d COMPUTE`` ("Driver Version", "CUDA
  Version", nvidia-smi(1)); the driver also from ``/proc/driver/nvidia/version``;
- VBIOS per GPU: ``/proc/driver/nvidia/gpus/<pci>/information`` ("Video BIOS"), else the
  "VBIOS Version" field when nvidia-smi printed it;
- HCA firmware: ``/sys/class/infiniband/<dev>/fw_ver`` (kernel ABI,
  Documentation/ABI/stable/sysfs-class-infiniband: "fw_ver: firmware version");
- OFED: ``ofed_info -s`` (MLNX_OFED / DOCA-Host) under a deadline; inbox rdma-core has none;
- kernel: ``/proc/sys/kernel/osrelease``;
- NCCL: the library a job loads (``find_nccl``): the nvidia-nccl-cu* wheel that PyTorch
  loads (``site-packages/nvidia/nccl/lib/libnccl.so.2``, its version from the wheel's
  ``include/nccl.h`` or dist-info) before the system's ``libnccl.so.X.Y.Z``; a container's
  or a job venv's NCCL where the site names its directory (``nccl_lib_dirs``); else
  "unknown" with the file found.

``node.versions`` compares the inventory with the site's pins (drain on a mismatch, warn
when a pinned version cannot be read). ``node.version_skew`` compares it with the other
nodes of the job, whose hooks leave their inventories in a shared ``versions_dir``: a
value that differs from the majority is reported (a warning unless the site asks to fail).
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass

from slurmfabric._common.probe import run_command
from slurmfabric._common.sysfs import list_dir, read_text
from slurmfabric.health.family import Fact, Family, Gathering, Key, table_problem
from slurmfabric.health.model import FAIL, OK, WARN, CheckResult, Metric

COMPONENTS = ("driver", "cuda", "vbios", "hca_fw", "ofed", "kernel", "nccl")
NCCL_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
             "/usr/local/lib", "/usr/local/cuda/lib64")
# nccl.h's version macros (NVIDIA/nccl src/nccl.h.in; the nvidia-nccl-cu* wheels ship the
# header beside the library, nvidia/nccl/include/nccl.h)
_NCCL_H = re.compile(r"^#define NCCL_(MAJOR|MINOR|PATCH)\s+(\d+)\s*$", re.M)
_WHEEL_INFO = re.compile(r"nvidia_nccl_cu\d+-(\d+\.\d+\.\d+)\.dist-info$")
_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_NCCL = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)$")


@dataclass(frozen=True)
class Inventory:
    """This node's versions, what could not be read (and why), and the job's peers'."""

    node: str
    versions: dict[str, object]  # scalar components -> str; vbios/hca_fw -> {device: str}
    unread: dict[str, str]
    peers: dict[str, dict[str, object]]  # node -> its versions (from versions_dir)
    written: str | None = None  # where this inventory was written, or why it was not


# --- reading (each part fail-open) ----------------------------------------------------------


# A release name: MLNX_OFED_LINUX-5.4-3.5.8.0, OFED-internal-24.10-1.1.4 (DOCA-Host); no
# spaces, so a shell's "ofed_info: command not found" or a banner is not taken for one.
_OFED_VERSION = re.compile(r"[A-Za-z][\w.+-]{0,119}")


def parse_ofed_info(text: str) -> str | None:
    """``ofed_info -s`` prints ``MLNX_OFED_LINUX-23.10-1.1.9.0:`` (one line, colon); the
    first non-empty line, when it is a release name."""
    for line in text.splitlines()[:50]:
        line = line.strip().rstrip(":")
        if line:
            return line if _OFED_VERSION.fullmatch(line) else None
    return None


def _nvidia(root: str, smi: str, timeout: float, found: dict, unread: dict) -> None:
    from slurmfabric._common.probe import ProbeError
    from slurmfabric.health.checks.clocks import parse_q
    from slurmfabric.health.checks.gpu import normal_bus_id, run_nvsmi

    text = read_text(os.path.join(root, "proc/driver/nvidia/version"))
    match = _NVRM.search(text or "")
    if match:
        found["driver"] = match.group(1)
    vbios = {}
    for pci in list_dir(os.path.join(root, "proc/driver/nvidia/gpus")):
        info = read_text(os.path.join(root, "proc/driver/nvidia/gpus", pci, "information"))
        for line in (info or "").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Video BIOS" and value.strip() not in ("", "??.??.??.??.??"):
                vbios[normal_bus_id(pci)] = value.strip()
    try:
        report = parse_q(run_nvsmi(smi, ["-q", "-d", "COMPUTE"], timeout))
    except ProbeError as exc:
        unread["cuda"] = str(exc)
        if "driver" not in found:
            unread["driver"] = str(exc)
    else:
        for key, name in (("Driver Version", "driver"), ("CUDA Version", "cuda")):
            value = report.header.get(key, "")
            if value and value.upper() != "N/A":
                found.setdefault(name, value)
        from_proc = bool(vbios)
        for bus, fields in zip(report.bus_ids, report.gpus):
            if fields.get("VBIOS Version") and not from_proc:
                vbios[normal_bus_id(bus)] = fields["VBIOS Version"]
    if vbios:
        found["vbios"] = dict(sorted(vbios.items()))
    else:
        unread["vbios"] = "no /proc/driver/nvidia/gpus/*/information with a Video BIOS"


def collect_local(node: str, expect: dict, timeout: float, gpus: bool = True) -> Inventory:
    """This node's inventory; nothing here raises for a missing tool. nvidia-smi and
    ofed_info share one deadline of ``timeout`` seconds, so two hung tools cost no more."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.05, deadline - time.monotonic())

    root = str(expect.get("sysfs_root") or "/")
    found: dict[str, object] = {}
    unread: dict[str, str] = {}
    if gpus:
        _nvidia(root, str(expect.get("nvidia_smi") or "/usr/bin/nvidia-smi"), left(),
                found, unread)
    hcas = {}
    ib = os.path.join(root, "sys/class/infiniband")
    for dev in list_dir(ib):
        fw = read_text(os.path.join(ib, dev, "fw_ver"))
        if fw:
            hcas[dev] = fw
    if hcas:
        found["hca_fw"] = hcas
    else:
        unread["hca_fw"] = f"no fw_ver under {ib}"
    ofed = str(expect.get("ofed_info") or "/usr/bin/ofed_info")
    if os.path.exists(ofed):
        try:
            out = run_command([ofed, "-s"], left(), name="ofed_info")
            value = parse_ofed_info(out.stdout) if out.returncode == 0 else None
            if value:
                found["ofed"] = value
            elif out.returncode == 0:
                head = (out.stdout.strip().splitlines() or ["nothing"])[0][:60]
                unread["ofed"] = f"ofed_info -s printed no release name: {head!r}"
            else:
                unread["ofed"] = f"ofed_info -s exit {out.returncode}"
        except Exception as exc:  # a ProbeError (deadline) or an unexpected failure
            unread["ofed"] = str(exc)
    else:
        unread["ofed"] = f"{ofed} not found (inbox rdma-core has no OFED version)"
    kernel = read_text(os.path.join(root, "proc/sys/kernel/osrelease"))
    if kernel:
        found["kernel"] = kernel
    else:
        unread["kernel"] = "no /proc/sys/kernel/osrelease"
    nccl = find_nccl(root, expect.get("nccl_lib_dirs") or default_nccl_dirs())
    if nccl and nccl[1]:
        found["nccl"] = nccl[1]
    elif nccl:
        unread["nccl"] = f"{nccl[0]}: version unknown (no nccl.h, wheel metadata or X.Y.Z name)"
    else:
        unread["nccl"] = ("no libnccl.so in a Python environment's nvidia/nccl/lib or the "
                          "system library directories")
    return Inventory(node, found, unread, {})


def default_nccl_dirs() -> list[str]:
    """This Python's site-packages (a torch wheel's bundled NCCL), then the system's."""
    import sys

    sites = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    return sites + list(NCCL_DIRS)


def _nccl_in(base: str) -> list[str]:
    """Library files in ``base``: a libnccl file itself, a lib directory, a site-packages
    directory (the wheel's nvidia/nccl/lib) or a root holding either."""
    if os.path.isfile(base):
        return [base]
    found = []
    for lib in (base, os.path.join(base, "nvidia", "nccl", "lib")):
        found += sorted(glob.glob(os.path.join(glob.escape(lib), "libnccl.so*")))
    return found


def nccl_version_of(path: str) -> str | None:
    """X.Y.Z of one libnccl file: its name or its symlink target's (libnccl.so.2 ->
    libnccl.so.2.21.5, the Debian/RPM packages), else the wheel's nccl.h beside it
    (../include/nccl.h), else the wheel's dist-info name; None when nothing says."""
    for name in (os.path.basename(path), os.path.basename(os.path.realpath(path))):
        match = _NCCL.search(name)
        if match:
            return match.group(1)
    lib = os.path.dirname(path)
    header = read_text(os.path.join(os.path.dirname(lib), "include", "nccl.h")) or ""
    parts = dict(_NCCL_H.findall(header[:200_000]))
    if len(parts) == 3:
        return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    if lib.endswith(os.path.join("nvidia", "nccl", "lib")):
        site = os.path.dirname(os.path.dirname(os.path.dirname(lib)))
        for entry in list_dir(site):
            match = _WHEEL_INFO.match(entry)
            if match:
                return match.group(1)
    return None


def find_nccl(root: str, dirs: list[str] | tuple[str, ...]) -> tuple[str, str | None] | None:
    """(library, version or None) of the first NCCL found along ``dirs`` (under
    ``root``), in order: the first place holding one is the one a job loads. In one
    system directory the newest X.Y.Z wins."""
    for directory in dirs:
        base = os.path.join(root, str(directory).lstrip("/"))
        libs = _nccl_in(base)
        if not libs:
            continue
        versions = [(lib, nccl_version_of(lib)) for lib in libs]
        known = [item for item in versions if item[1]]
        if known:
            return max(known, key=lambda item: tuple(int(x) for x in str(item[1]).split(".")))
        return versions[0]
    return None


def collect(node: str, expect: dict, timeout: float, hook: str, nodelist: str | None,
            gpus: bool = True) -> Inventory:
    """The local inventory, written to ``versions_dir/<node>.json`` by the prolog and the
    periodic check (never by ``health check``), plus the job's other nodes' inventories."""
    inv = collect_local(node, expect, timeout, gpus)
    directory = str(expect.get("versions_dir") or "")
    if not directory:
        return inv
    from slurmfabric._common import files

    written: str | None = None
    if hook in ("prolog", "periodic"):
        path = os.path.join(directory, f"{files.safe_name(node)}.json")
        try:
            files.write_json(path, {"node": node, "time": time.time(),
                                    "versions": inv.versions, "unread": inv.unread})
            written = path
        except OSError as exc:
            written = f"not written: {exc.strerror or exc}"
    peers: dict[str, dict[str, object]] = {}
    if nodelist:
        from slurmfabric.slurm.hostlist import HostlistError, expand

        try:
            names = expand(nodelist)
        except HostlistError:
            names = []
        for name in names:
            if name == node:
                continue
            data = files.read_json_or_none(os.path.join(directory, f"{files.safe_name(name)}.json"))
            if isinstance(data, dict) and isinstance(data.get("versions"), dict):
                peers[name] = data["versions"]
    return Inventory(node, inv.versions, inv.unread, peers, written)


# --- comparing (pure) -----------------------------------------------------------------------


def flatten(versions: dict[str, object]) -> dict[str, str]:
    """Comparable components: per-device ones become the set of values they hold, HCA
    firmware per family (its first number: 28 ConnectX-7, 22 ConnectX-6 Dx ...), so a
    node with two NIC models compares each model with its kind."""
    flat: dict[str, str] = {}
    for name, value in versions.items():
        if isinstance(value, dict):
            if name == "hca_fw":
                families: dict[str, set[str]] = {}
                for fw in value.values():
                    families.setdefault(str(fw).split(".")[0], set()).add(str(fw))
                for family, seen in families.items():
                    flat[f"hca_fw:{family}"] = ",".join(sorted(seen))
            else:
                flat[name] = ",".join(sorted({str(v) for v in value.values()}))
        elif value is not None:
            flat[name] = str(value)
    return flat


@dataclass(frozen=True)
class Odd:
    node: str
    component: str
    value: str | None  # None: this node does not report it
    majority: str
    count: int  # nodes with the majority value
    total: int  # nodes compared


def drift(inventories: dict[str, dict[str, object]]) -> list[Odd]:
    """Nodes whose value of a component differs from a strict majority of the nodes that
    report it. No strict majority (2 nodes that differ, or a 3-way split): nothing odd."""
    flat = {node: flatten(versions) for node, versions in inventories.items()}
    components = sorted({c for values in flat.values() for c in values})
    odd = []
    for component in components:
        reported = {n: v[component] for n, v in flat.items() if component in v}
        if len(reported) < 3:
            continue
        value, count = Counter(reported.values()).most_common(1)[0]
        if count * 2 <= len(reported):
            continue
        for node in sorted(reported):
            if reported[node] != value:
                odd.append(Odd(node, component, reported[node], value, count, len(reported)))
    return odd


def _pins(expect: dict) -> dict[str, list[str]]:
    raw = expect.get("versions") or {}
    return {k: [v] if isinstance(v, str) else [str(x) for x in v] for k, v in raw.items()}


def check_pins(inv: Inventory, expect: dict, ctx) -> CheckResult:
    """Each pinned component must hold a pinned value: a driver, CUDA, OFED, kernel or
    NCCL version; every GPU's VBIOS; every HCA's firmware against the pin of its family."""
    pins = _pins(expect)
    bad, warn = [], []
    for component, allowed in pins.items():
        have = inv.versions.get(component)
        if have is None:
            warn.append(f"{component} pinned to {' or '.join(allowed)} but unreadable: "
                        f"{inv.unread.get(component, 'not read')}")
            continue
        if component == "hca_fw":
            by_family = {a.split(".")[0]: a for a in allowed}
            for dev, fw in sorted(dict(have).items()):
                want = by_family.get(str(fw).split(".")[0])
                if want is not None and fw not in allowed:
                    bad.append(f"hca_fw {dev} {fw} (pinned {want})")
        elif isinstance(have, dict):
            for dev, value in sorted(have.items()):
                if value not in allowed:
                    bad.append(f"{component} {dev} {value} (pinned {' or '.join(allowed)})")
        elif have not in allowed:
            bad.append(f"{component} {have} (pinned {' or '.join(allowed)})")
    metrics = tuple(Metric("slurmfabric_node_version_info", 1.0,
                           (("component", c), ("version", v)))
                    for c, v in sorted(flatten(inv.versions).items()))
    values = {"versions": inv.versions, "unread": inv.unread, "pins": pins}
    if bad:
        return CheckResult("node.versions", FAIL, "; ".join(bad), values, metrics)
    if warn:
        return CheckResult("node.versions", WARN, "; ".join(warn), values, metrics)
    return CheckResult("node.versions", OK, "", values, metrics)


def check_drift(inv: Inventory, expect: dict, ctx) -> CheckResult:
    """This node against the job's other nodes (their inventories in ``versions_dir``)."""
    if not inv.peers:
        why = ("no versions_dir configured" if not expect.get("versions_dir") else
               "no inventory of another node of this job in versions_dir")
        return CheckResult("node.version_skew", OK, why, {"peers": 0})
    mine = [o for o in drift({**inv.peers, inv.node: inv.versions}) if o.node == inv.node]
    values = {"peers": len(inv.peers), "written": inv.written}
    if not mine:
        return CheckResult("node.version_skew", OK, "", values)
    reason = "; ".join(f"{o.component} {o.value} ({o.count}/{o.total} nodes of the job have "
                       f"{o.majority})" for o in mine)
    status = FAIL if expect.get("version_skew_fail") else WARN
    return CheckResult("node.version_skew", status, reason, values)


# name -> (function, default on_error, hooks). Fact key "versions".
CHECKS = {
    "node.versions": (check_pins, "pass", ("prolog", "check", "periodic")),
    "node.version_skew": (check_drift, "pass", ("prolog", "check")),
}


def load_inventories(paths: list[str]) -> dict[str, dict[str, object]]:
    """``<node>.json`` files (or directories of them) written by the hooks."""
    files = []
    for path in paths:
        files += sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) \
            else [path]
    out = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("versions"), dict):
            out[str(data.get("node") or os.path.basename(path)[:-5])] = data["versions"]
    return out


PINS = ("driver", "cuda", "vbios", "hca_fw", "ofed", "kernel", "nccl")


def pins_problem(value: object) -> str | None:
    """``versions = {driver = "550.54.15", hca_fw = ["28.39.1002", "22.39.1002"]}``."""
    from slurmfabric._common.textcheck import one_line

    def entry(name: str, item: object) -> str | None:
        if name not in PINS:
            return f"versions.{one_line(repr(name))} is not a component; use {', '.join(PINS)}"
        items = item if isinstance(item, list) else [item]
        if not items or not all(isinstance(v, str) and v.strip() and "\n" not in v
                                for v in items):
            return (f"versions.{name} = {one_line(repr(item))[:60]} should be a version "
                    "string or a list of them")
        return None

    return table_problem(value, "versions", '{ driver = "550.54.15" }', entry)


def _collect(run: Gathering, timeout: float) -> Inventory:
    from slurmfabric.health.checks.gpu import gathered

    return collect(run.ctx.node, run.expect, timeout, run.ctx.hook, run.ctx.job_nodelist,
                   gathered(run))


FAMILY = Family("versions", keys={  # node.versions / node.version_skew
    "versions": Key({}, check=pins_problem),  # pins: {driver = "550.54.15", ...}
    "versions_dir": Key(""),  # shared directory for every node's inventory; "": no drift
    "version_skew_fail": Key(False),  # true: a node unlike the job's majority fails
    "ofed_info": Key("/usr/bin/ofed_info"),
    "nccl_lib_dirs": Key([], kind="strings"),  # []: site-packages, then system library dirs
}, facts=(Fact("versions", _collect, CHECKS),))
