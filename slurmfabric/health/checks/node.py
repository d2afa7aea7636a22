"""Node checks: leftover job processes (psutil, imported lazily), free memory and disk.

Each ``collect_*`` gathers facts (run by the runner with a deadline); each ``check_*`` is a
pure function of them.
"""

from __future__ import annotations

import os

from slurmfabric._common.probe import PROBE_MARK, ProbeError, proc_stat
from slurmfabric._common.sysfs import Root, read_text
from slurmfabric.health.family import Fact, Family, Key
from slurmfabric.health.model import FAIL, OK, CheckResult, Metric

GB = 1024**3


def collect_meminfo(root: str) -> dict[str, int]:
    """/proc/meminfo as bytes (``MemAvailable`` is the kernel's own estimate)."""
    text = read_text(Root(root)("/proc/meminfo"))
    if text is None:
        raise ProbeError(f"cannot read {Root(root)('/proc/meminfo')}")
    info = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            info[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return info


def collect_disks(paths: list[str]) -> dict[str, int | str]:
    """Free bytes per configured path (statvfs), or the error text for that path."""
    free: dict[str, int | str] = {}
    for path in paths:
        try:
            st = os.statvfs(path)
        except OSError as exc:
            free[path] = f"{exc.strerror or exc}"
            continue
        free[path] = st.f_bavail * st.f_frsize
    return free


def _own_family() -> set[int]:
    """Our own pid and ancestors: the hook itself runs with the job's SLURM_JOB_ID."""
    pids, pid = {os.getpid()}, os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        stat = proc_stat(pid)
        if not stat:
            break
        try:
            pid = int(stat[1][1])
        except (IndexError, ValueError):
            break
    return pids


def collect_leftovers(job_id: str | None, ignore: list[str],
                      node: str | None = None) -> list[dict[str, object]]:
    """Processes still running for the job on this node: its id in their cgroup path
    (proctrack/cgroup) or SLURM_JOB_ID in their environment (proctrack/linuxproc, setsid
    escapees). Not leftovers: this hook's whole own tree (its ancestors, its descendants,
    and its probes even once orphaned: they carry ``PROBE_MARK`` with our pid, since they
    inherit the job's SLURM_JOB_ID), Slurm's own hook processes (SLURM_SCRIPT_CONTEXT set:
    other prologs and epilogs of the job, prolog_epilog.shtml) and tasks of another node
    (SLURMD_NODENAME differs: several virtual nodes on one host)."""
    if not job_id:
        return []
    import psutil  # lazy: 40 ms, only the epilog needs it

    procs = list(psutil.process_iter(["pid", "ppid", "name", "username"]))
    family = _own_family() | _descendants(os.getpid(), procs)
    me, found = str(os.getpid()), []
    for proc in procs:
        if proc.info["pid"] in family or proc.info["name"] in ignore:
            continue
        try:
            with open(f"/proc/{proc.pid}/cgroup", encoding="ascii", errors="replace") as f:
                in_cgroup = f"/job_{job_id}/" in f.read() + "/"
            environ = proc.environ()
        except (psutil.Error, OSError):
            continue
        if environ.get("SLURM_SCRIPT_CONTEXT") or environ.get(PROBE_MARK) == me:
            continue
        if node and environ.get("SLURMD_NODENAME", node) != node:
            continue
        ours = in_cgroup or environ.get("SLURM_JOB_ID") == job_id
        if ours and proc.info["name"] not in ("slurmstepd",):
            found.append({"pid": proc.pid, "name": proc.info["name"],
                          "user": proc.info["username"]})
    return found


def _descendants(root: int, procs: list) -> set[int]:
    """Every process below ``root`` in one snapshot's parent links."""
    children: dict[int, list[int]] = {}
    for proc in procs:
        children.setdefault(proc.info["ppid"] or 0, []).append(proc.info["pid"])
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def check_memory(facts: dict[str, int], expect: dict, ctx) -> CheckResult:
    want = expect.get("min_free_mem_gb")
    avail = facts.get("MemAvailable", facts.get("MemFree", 0))
    values = {"available_gb": round(avail / GB, 2), "min_gb": want}
    metric = (Metric("slurmfabric_node_memory_available_bytes", avail),)
    if want is not None and avail < float(want) * GB:
        return CheckResult("node.memory", FAIL, f"{avail / GB:.1f} GB available, "
                           f"expected at least {want} GB", values, metric)
    return CheckResult("node.memory", OK, "", values, metric)


def check_disk(facts: dict[str, int | str], expect: dict, ctx) -> CheckResult:
    limits: dict[str, float] = expect.get("disks") or {}
    bad, values, metrics = [], {}, []
    for path, free in facts.items():
        if isinstance(free, str):
            bad.append(f"{path}: {free}")
            continue
        values[path] = round(free / GB, 2)
        metrics.append(Metric("slurmfabric_node_disk_free_bytes", free, (("path", path),)))
        if free < float(limits.get(path, 0)) * GB:
            bad.append(f"{path} {free / GB:.1f} GB free, expected {limits[path]} GB")
    status = FAIL if bad else OK
    return CheckResult("node.disk", status, "; ".join(bad), values, tuple(metrics))


def check_leftovers(facts: list[dict[str, object]], expect: dict, ctx) -> CheckResult:
    if not facts:
        return CheckResult("node.leftovers", OK, "", {"count": 0})
    shown = ", ".join(f"{p['pid']} ({p['name']})" for p in facts[:3])
    more = f" and {len(facts) - 3} more" if len(facts) > 3 else ""
    return CheckResult("node.leftovers", FAIL,
                       f"{len(facts)} processes of job {ctx.job_id} left: {shown}{more}",
                       {"count": len(facts), "pids": [p["pid"] for p in facts]})


# name -> (function, default on_error, hooks)
CHECKS = {
    "node.memory": (check_memory, "pass", ("prolog", "epilog", "check")),
    "node.disk": (check_disk, "fail", ("prolog", "epilog", "check", "periodic")),
    "node.leftovers": (check_leftovers, "pass", ("epilog",)),
}



def _only(name: str) -> dict:
    return {name: CHECKS[name]}


FAMILY = Family("node", keys={
    "min_free_mem_gb": Key(None, (0, None)),
    "disks": Key({}, kind="numbers"),  # path -> minimum free GB
    "leftover_ignore": Key([], kind="strings"),  # process names never counted as leftovers
}, facts=(
    Fact("meminfo", lambda run, t: collect_meminfo(str(run.expect.get("sysfs_root") or "/")),
         _only("node.memory")),
    Fact("disks", lambda run, t: collect_disks(list(run.expect.get("disks") or {})),
         _only("node.disk"), gate=lambda run: bool(run.expect.get("disks"))),
    Fact("leftovers", lambda run, t: collect_leftovers(
        run.ctx.job_id, list(run.expect.get("leftover_ignore") or []), run.ctx.node),
        _only("node.leftovers"), gate=lambda run: bool(run.ctx.job_id),
        events=frozenset({"node.leftovers"})),
))
