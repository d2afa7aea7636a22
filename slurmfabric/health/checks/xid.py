"""Xid errors in the kernel log (``gpu.xid``): new NVIDIA driver errors since the last run.

The NVIDIA driver logs each GPU error as ``NVRM: Xid (PCI:0000:2b:00): 79, <text>`` in the
kernel log. This check reads the records of ``/dev/kmsg`` (or a recorded stream in the same
format, ``kmsg_source`` in the site config) newer than a cursor kept in the state directory,
so each message is judged once and a node is never drained twice for it. Each Xid is judged
by the "Resolution Bucket (Immediate Action)" of NVIDIA's Xid catalog
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, read 2026-12-01; a
copy with sources is in tests/fixtures/health/xid/). Actions that need the GPU reset, the
node rebooted or support drain the node. Application errors (RESTART_APP: 13, 31, 43, ...)
and IGNORE only warn. Sites override with ``xid_drain``/``xid_ignore``. A GPU the driver
lost drains whether or not an Xid line came with it ("fallen off the bus", "RmInitAdapter
failed": ``parse_lost``), its bus id in the reason.

/dev/kmsg record format (the kernel's Documentation/ABI/testing/dev-kmsg): one record per
read(2), ``<priority>,<sequence>,<timestamp_us>,<flags>[,...];<message>``, with continuation
lines starting with a space. EPIPE means that records were overwritten; reading again goes on
with the oldest record still there. Standard library only: this runs in the prolog.

Each Xid names its GPU by PCI address and, where the driver says, by its device minor (the
``N`` of ``/dev/nvidiaN``, which Slurm's gres.conf and SLURM_JOB_GPUS count in), read from
``/proc/driver/nvidia/gpus/<pci>/information``. An Xid is attributed to the jobs that were
running on the node when it was logged: the prolog of each job leaves its start time in the
state directory until its epilog (``state.job_file``). The record's timestamp counts from
boot on the kernel's local clock, which like CLOCK_MONOTONIC does not run in suspend.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time

from slurmfabric._common.files import write_atomic
from slurmfabric._common.probe import ProbeError
from slurmfabric.health.checks.gpu import gathered
from slurmfabric.health.family import Fact, Family, Gathering, Key
from slurmfabric.health.model import FAIL, OK, WARN, CheckResult

# Xid -> (mnemonic, NVIDIA's immediate action), from the catalog named above.
CATALOG: dict[int, tuple[str, str]] = {
    8: ("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP"),
    13: ("ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP"),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    32: ("ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP"),
    38: ("ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE"),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE"),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45"),
    46: ("ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU"),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48"),
    56: ("DISPLAY_CHANNEL_EXCEPTION", "CONTACT_SUPPORT"),
    57: ("FB_LINK_TRAINING_FAILURE_ERROR", "CONTACT_SUPPORT"),
    58: ("FB_MEMORY_ERROR", "CONTACT_SUPPORT"),
    61: ("PMU_BREAKPOINT", "CONTACT_SUPPORT"),
    62: ("PMU_HALT_ERROR", "RESET_GPU"),
    63: ("INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE"),
    64: ("INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU"),
    65: ("ROBUST_CHANNEL_NVENC1_ERROR", "CONTACT_SUPPORT"),
    68: ("ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP"),
    69: ("ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP"),
    73: ("ROBUST_CHANNEL_NVENC2_ERROR", "CONTACT_SUPPORT"),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    80: ("PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP"),
    81: ("ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "CONTACT_SUPPORT"),
    92: ("EXCESSIVE_SBE_INTERRUPTS", "IGNORE"),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    109: ("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU"),
    110: ("SEC_FAULT_ERROR", "RESET_GPU"),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU"),
    120: ("GSP_ERROR", "RESET_GPU"),
    121: ("C2C_ERROR", "IGNORE"),
    136: ("ALI_TRAINING_FAIL", "RESET_GPU"),
    137: ("NVLINK_PRIV_ERR", "IGNORE"),
    140: ("UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU"),
    143: ("GPU_INIT_ERROR", "RESET_GPU"),
    144: ("NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    145: ("NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    146: ("NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR"),
    147: ("NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR"),
    148: ("NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR"),
    149: ("NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR"),
    150: ("NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR"),
    151: ("ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM"),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "XID_154"),
    155: ("NVLINK_SW_DEFINED_ERROR", "RESET_GPU"),
    156: ("RESOURCE_RETIREMENT_EVENT", "RESET_GPU"),
    157: ("RESOURCE_RETIREMENT_FAILURE", "IGNORE"),
    158: ("GPU_FATAL_TIMEOUT", "RESET_GPU"),
    159: ("ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM"),
}
# Immediate actions that mean the node cannot take the next job as it is.
DRAIN_ACTIONS = frozenset({"RESET_GPU", "RESTART_BM", "RESTART_VM", "CONTACT_SUPPORT",
                           "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_XID_48",
                           "CHECK_MECHANICALS"})

# "NVRM: Xid (PCI:0000:2b:00): 79, ..." (and the older "(0000:01:00): 3, ...", and MIG's
# "(PCI:0000:01:00 GPU-I:05): 94, ..."). The first number after "): " is the Xid: a later
# "caused by previous Xid 149" is text.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
                  r"(?:\.[0-9A-Fa-f])?(?: [^()]{1,40})?\): (?P<xid>[0-9]{1,4}),? ?(?P<text>.*)")
# A GPU the driver lost, with or without an Xid line (NVIDIA's open-gpu-kernel-modules,
# src/nvidia/arch/nvalloc/unix/src/osinit.c and kernel-open/nvidia/nv.c; forms seen in
# NVIDIA/NVSentinel#155, NVIDIA/open-gpu-kernel-modules#789, NVIDIA/gpu-operator#1146):
#   "NVRM: The NVIDIA GPU 0000:b3:00.0\n NVRM: (PCI ID: 10de:26b5) installed in this system
#    has\n NVRM: fallen off the bus and is not responding to commands." (one printk: one
#    /dev/kmsg record with the newlines escaped as \x0a, or three journal lines)
#   "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus." / "NVRM: GPU at 0000:01:00.0 has
#    fallen off the bus." (older drivers)
#   "NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)" and
#   "rm_init_adapter failed, device minor number 0" (older: "...for device bearing minor
#    number 0", "rm_init_adapter(0) failed"): the driver could not bring the GPU up.
#   "NVRM: nvCheckOkFailedNoLog: GPU lost from the bus [NV_ERR_GPU_IS_LOST]" (RM's status
#    0x0f, printed by its check macros after the GPU stopped answering; no bus id).
_PCI = re.compile(r"(?:PCI:)?(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?")
_LOST = (("fallen off the bus", "fallen off the bus"),
         ("RmInitAdapter failed", "driver could not initialise it (RmInitAdapter failed)"),
         ("rm_init_adapter", "driver could not initialise it (rm_init_adapter failed)"),
         ("NV_ERR_GPU_IS_LOST", "the driver lost it (NV_ERR_GPU_IS_LOST)"),
         ("None of the NVIDIA devices were initialized", "no NVIDIA device was initialised"),
         ("probe routine failed", "the driver's probe failed"))
_MINOR = re.compile(r"minor number (?P<m>[0-9]{1,4})|rm_init_adapter\((?P<n>[0-9]{1,4})\)")
_RECORD = re.compile(r"^(?P<pri>[0-9]{1,9}),(?P<seq>[0-9]{1,20}),(?P<us>[0-9]{1,20}),[^;]{0,64};")
MAX_RECORDS = 200_000  # a ring buffer holds far fewer; more means the source is not kmsg


def parse_record(text: str) -> tuple[int, int, str] | None:
    """One /dev/kmsg record -> (sequence, microseconds since boot, message), else None."""
    match = _RECORD.match(text)
    if not match:
        return None
    message = text[match.end():].split("\n", 1)[0]  # continuation lines are key=value
    return int(match.group("seq")), int(match.group("us")), message


def parse_xid(message: str) -> dict[str, object] | None:
    match = _XID.search(message[:4096])
    if not match:
        return None
    return {"xid": int(match.group("xid")), "pci": match.group("pci").lower(),
            "text": match.group("text").strip()[:200]}


def parse_lost(message: str, pci_before: str | None = None) -> dict[str, object] | None:
    """A kernel message that means the driver lost a GPU (no Xid needed), else None.
    ``pci_before``: the bus id of the NVRM record just before, for a message the driver
    split over records ("The NVIDIA GPU 0000:b3:00.0" then "... fallen off the bus")."""
    head = message[:4096]
    if "NVRM" not in head or parse_xid(head) is not None:
        return None
    what = next((text for key, text in _LOST if key in head), None)
    if what is None:
        return None
    pci = _PCI.search(head)
    minor = _MINOR.search(head)
    return {"what": what, "pci": pci.group("pci").lower() if pci else pci_before,
            "minor": int(minor.group("m") or minor.group("n")) if minor else None,
            "text": head.strip()[:200]}


def record_pci(message: str) -> str | None:
    """The GPU bus id an NVRM record names ("NVRM: The NVIDIA GPU 0000:b3:00.0")."""
    if "NVRM" not in message[:4096]:
        return None
    match = _PCI.search(message[:4096])
    return match.group("pci").lower() if match else None


def _carry(message: str, pci: str | None, carried: int) -> tuple[str | None, int]:
    """The bus id that the next record may continue: the one this NVRM record names, else
    the previous one for up to 3 NVRM records (a message split over journal lines)."""
    named = record_pci(message)
    if named is not None:
        return named, 0
    if pci is not None and "NVRM" in message[:4096] and carried < 3:
        return pci, carried + 1
    return None, 0


def _records(source: str) -> tuple[list[str], int]:
    """The records of a kmsg device (one per read, non-blocking) or of a recorded file."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ProbeError(f"cannot read the kernel log {source}: {exc.strerror or exc}") \
            from None
    out: list[str] = []
    lost = 0
    try:
        if not os.path.isfile(source):  # the device: one record per read
            while len(out) < MAX_RECORDS:
                try:
                    chunk = os.read(fd, 16384)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # overwritten before we read them
                        lost += 1
                        continue
                    raise ProbeError(f"reading {source}: {exc.strerror or exc}") from None
                if not chunk:
                    break
                out.append(chunk.decode("utf-8", "replace"))
        else:
            data = b""
            while len(data) < 64 * 1024 * 1024:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
            out = [line for line in data.decode("utf-8", "replace").splitlines()
                   if line and not line.startswith(" ")][:MAX_RECORDS]
    finally:
        os.close(fd)
    return out, lost


def gpu_minor(root: str, pci: str) -> int | None:
    """The device minor of the GPU at ``pci`` (``0000:2b:00``), from the driver's procfs."""
    path = os.path.join(root, "proc/driver/nvidia/gpus", f"{pci}.0", "information")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(8192)
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Device Minor" and value.strip().isascii() and value.strip().isdigit():
            return int(value.strip())
    return None


def running_jobs(jobs_dir: str | None, node: str | None) -> list[tuple[str, float]]:
    """(job id, prolog start) of the jobs whose prolog ran here and whose epilog has not."""
    if not jobs_dir or not node:
        return []
    try:
        names = os.listdir(jobs_dir)
    except OSError:
        return []
    jobs = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            with open(os.path.join(jobs_dir, name), encoding="utf-8") as handle:
                data = json.load(handle)
            if data.get("node") == node and data.get("job_id"):
                jobs.append((str(data["job_id"]), float(data["time"])))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    return sorted(jobs, key=lambda job: job[1])


def collect(source: str, cursor_path: str, root: str = "/", jobs_dir: str | None = None,
            node: str | None = None) -> dict[str, object]:
    """New Xid messages since the cursor; the cursor moves past everything read.

    The first run on a node has no cursor: it starts at the end of the log and reports what
    it skipped as history, so an old, already handled Xid never drains a node."""
    boot = time.time() - time.monotonic()  # wall-clock time of the kernel's timestamp 0
    records, lost = _records(source)
    try:
        with open(cursor_path) as handle:
            text = handle.read(64).strip()
        cursor: int | None = int(text) if text.isascii() and text.isdigit() else None
    except OSError:
        cursor = None
    parsed = [record for record in map(parse_record, records) if record is not None]
    newest = max((seq for seq, _, _ in parsed), default=None)
    note = ""
    if cursor is not None and newest is not None and newest < cursor:
        cursor, note = -1, "the log restarted (a reboot): every record is new"
    events, history, gone = [], 0, []
    seen_gone: dict[str | None, dict] = {}
    pci_before: str | None = None
    carried = 0
    for seq, us, message in parsed:
        if cursor is not None and seq <= cursor:
            pci_before, carried = _carry(message, pci_before, carried)
            continue
        xid = parse_xid(message)
        loss = parse_lost(message, pci_before) if xid is None else None
        pci_before, carried = _carry(message, pci_before, carried)
        if xid is None and loss is None:
            continue
        if cursor is None:
            history += 1
            continue
        stamp = {"seq": seq, "us": us, "time": round(boot + us / 1e6, 3)}
        if xid is not None:
            events.append({**xid, **stamp})
            continue
        assert loss is not None
        # One incident per GPU: "fallen off the bus" then "probe routine failed", or
        # "RmInitAdapter failed!" then "rm_init_adapter failed ... minor number 0".
        first_seen = seen_gone.get(loss["pci"])
        if first_seen is None:
            seen_gone[loss["pci"]] = {**loss, **stamp}
            gone.append(seen_gone[loss["pci"]])
        elif first_seen["minor"] is None:
            first_seen["minor"] = loss["minor"]
    if events or gone:
        jobs = running_jobs(jobs_dir, node)
        minors: dict[str, int | None] = {}
        for event in events + gone:
            pci = str(event["pci"])
            if event["pci"] is not None and pci not in minors:
                minors[pci] = gpu_minor(root, pci)
            gpu = minors.get(pci) if event["pci"] is not None else None
            event["gpu"] = gpu if gpu is not None else event.get("minor")  # as the driver said
            # A second of slack: the prolog notes its start after reading the clock.
            event["jobs"] = [job for job, start in jobs if start - 1.0 <= float(event["time"])]
    last = newest if newest is not None else max(cursor or 0, 0)
    write_atomic(cursor_path, f"{last}\n")
    return {"events": events, "gone": gone, "first_run": cursor is None, "history": history,
            "lost": lost, "note": note}


def _action(xid: int, text: str, expect: dict) -> tuple[str, bool]:
    """(NVIDIA's action or 'unknown', drains?) with the site's overrides."""
    if xid in {int(x) for x in expect.get("xid_ignore") or []}:
        return "site: xid_ignore", False
    if xid in {int(x) for x in expect.get("xid_drain") or []}:
        return "site: xid_drain", True
    entry = CATALOG.get(xid)
    if entry is None:
        return "unknown", False
    action = entry[1]
    if action == "XID_154":  # "GPU recovery action changed from ... to 0x1 (GPU Reset ...)"
        return action, "(None)" not in text.rsplit(" to ", 1)[-1]
    return action, action in DRAIN_ACTIONS


def check_xid(facts: dict, expect: dict, ctx) -> CheckResult:
    """Fail on a new Xid whose catalog action needs a reset, reboot or support, and on a GPU
    the driver lost without one (fallen off the bus, RmInitAdapter failed); warn on
    application errors, Xids the catalog does not know, and lost records."""
    events = list(facts.get("events") or [])
    values: dict[str, object] = {"new_xids": len(events), "lost_records": facts.get("lost", 0)}
    bad: list[str] = []
    warn: list[str] = []
    seen: list[dict] = []
    for event in events:
        xid, pci, text = int(event["xid"]), str(event["pci"]), str(event["text"])
        action, drains = _action(xid, text, expect)
        name = CATALOG.get(xid, ("not in NVIDIA's catalog",))[0]
        gpu = "GPU" if event.get("gpu") is None else f"GPU{event['gpu']}"
        jobs = [str(job) for job in event.get("jobs") or []]
        during = f" during job {','.join(jobs)}" if jobs else ""
        line = f"Xid {xid} on {gpu} {pci}{during} ({name}, {action}): {text[:80]}"
        (bad if drains else warn).append(line)
        seen.append({"xid": xid, "pci": pci, "gpu": event.get("gpu"), "action": action,
                     "drains": drains, "jobs": jobs, "time": event.get("time")})
    if seen:
        values["xids"] = seen
    drained_pcis = {v["pci"] for v in seen if v["drains"]}
    gone = [g for g in facts.get("gone") or [] if g.get("pci") not in drained_pcis or
            g.get("pci") is None]
    for event in gone:  # a lost GPU drains with or without an Xid (the same incident once)
        pci = event.get("pci") or "bus id not in the message"
        gpu = "GPU" if event.get("gpu") is None else f"GPU{event['gpu']}"
        jobs = [str(job) for job in event.get("jobs") or []]
        during = f" during job {','.join(jobs)}" if jobs else ""
        bad.append(f"{gpu} {pci} lost{during}: {event['what']} ({str(event['text'])[:80]})")
    if gone:
        values["lost_gpus"] = [{"pci": g.get("pci"), "gpu": g.get("gpu"), "what": g["what"],
                                "time": g.get("time")} for g in gone]
    if facts.get("first_run") and facts.get("history"):
        warn.append(f"first run: {facts['history']} older Xid or lost-GPU message(s) in the "
                    "kernel log were skipped; later runs judge new ones")
    if facts.get("lost"):
        warn.append(f"{facts['lost']} kernel log record(s) were overwritten before they could "
                    "be read")
    if bad:
        return CheckResult("gpu.xid", FAIL, "; ".join(bad[:3]), values)
    if warn:
        return CheckResult("gpu.xid", WARN, "; ".join(warn[:3]), values)
    return CheckResult("gpu.xid", OK, "", values)


# name -> (function, default on_error, hooks). Fact key "kmsg". A kernel log that cannot be
# read is an error of the checker, never a reason to drain (on_error "pass").
CHECKS = {"gpu.xid": (check_xid, "pass", ("prolog", "epilog", "check", "periodic"))}



def _collect(run: Gathering, timeout: float) -> dict[str, object]:
    from slurmfabric._common.files import safe_name

    state = run.cfg.state_dir  # one cursor per node name: virtual nodes of one host apart
    return collect(str(run.expect["kmsg_source"]),
                   str(state / f"kmsg-cursor.{safe_name(run.ctx.node)}"),
                   str(run.expect.get("sysfs_root") or "/"), str(state / "jobs"), run.ctx.node)


FAMILY = Family("xid", keys={
    "kmsg_source": Key("/dev/kmsg"),  # the kernel log gpu.xid reads (a recorded stream in tests)
    "xid_drain": Key([], kind="xids"),  # Xids that drain whatever NVIDIA's catalog says
    "xid_ignore": Key([], kind="xids"),  # Xids that never drain or warn
}, facts=(Fact("kmsg", _collect, CHECKS, gate=gathered, events=frozenset({"gpu.xid"})),))
