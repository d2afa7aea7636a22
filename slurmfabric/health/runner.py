"""Run the checks: gather facts concurrently under deadlines, then judge them.

Facts (nvidia-smi/NVML, sysfs, /proc, statvfs, site commands) are gathered once, each in
its own thread; external programs run in their own process group with a per-probe
deadline (``probe.run_command``). The whole gathering has one budget that stays below
slurm.conf's PrologEpilogTimeout: anything unfinished at the deadline is reported as an
error of its checks and the hook goes on. Checks are pure functions of the facts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from slurmfabric._common.files import safe_name
from slurmfabric._common.probe import ProbeError, run_command
from slurmfabric.health.checks import (
    amd,
    clocks,
    dcgm,
    gpu,
    node,
    nvlink,
    rdma,
    roce,
    storage,
    versions,
    xid,
)
from slurmfabric.health.model import ERROR, FAIL, WARN, CheckResult, Context, worst
from slurmfabric.health.siteconfig import SiteConfig

# Checks that judge events since the last run (a kernel message, a counter's growth during
# a job, what a job left behind), not a state: passing the next time proves no repair, so a
# drain by one of them is never resumed automatically (hooks._clear_stale).
EVENT_CHECKS = frozenset({"gpu.xid", "rdma.counters", "node.leftovers", "gpu.nvlink_errors",
                          "rdma.roce_counters", "rdma.link_flaps"})


@dataclass(frozen=True)
class CheckSpec:
    name: str
    fact: str  # key into the gathered facts
    func: Callable[[Any, dict, Context], CheckResult]
    on_error: str  # "fail" (fail-closed) or "pass" (fail-open) when the checker errs
    hooks: tuple[str, ...]


@dataclass(frozen=True)
class RunResult:
    context: Context
    results: list[CheckResult]
    facts: dict[str, Any]
    seconds: float
    started: float  # epoch seconds

    @property
    def status(self) -> str:
        return worst(self.results)

    @property
    def blocking(self) -> list[CheckResult]:
        return [r for r in self.results if r.blocking]


def registry() -> list[CheckSpec]:
    specs = []
    for fact, table in (("gpu", gpu.CHECKS), ("rdma", rdma.CHECKS), ("roce", roce.CHECKS),
                        ("kmsg", xid.CHECKS),
                        ("nvlink", nvlink.LINK_CHECKS), ("fabric", nvlink.FABRIC_CHECKS),
                        ("dcgm", dcgm.CHECKS),
                        ("gpu_clocks", clocks.CHECKS), ("versions", versions.CHECKS),
                        (amd.FACT, amd.CHECKS), (storage.FACT, storage.CHECKS)):
        for name, (func, on_error, hooks) in table.items():
            specs.append(CheckSpec(name, fact, func, on_error, hooks))
    facts = {"node.memory": "meminfo", "node.disk": "disks", "node.leftovers": "leftovers"}
    for name, (func, on_error, hooks) in node.CHECKS.items():
        specs.append(CheckSpec(name, facts[name], func, on_error, hooks))
    return specs


def _site_command_spec(entry: dict[str, Any]) -> CheckSpec:
    """``commands = [{name = "dcgm", argv = ["dcgmi", "diag", "-r", "1"], hooks = [...]}]``:
    exit 0 is healthy, anything else fails with the last line it printed."""
    name = f"site.{entry['name']}"

    def judge(out, expect, ctx) -> CheckResult:
        if out.returncode == 0:
            return CheckResult(name, "ok", "", {"seconds": round(out.seconds, 3)})
        last = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
        return CheckResult(name, FAIL, f"exit {out.returncode}: {last[:160]}")

    hooks = tuple(entry.get("hooks", ("epilog_failed", "check")))
    return CheckSpec(name, f"cmd:{entry['name']}", judge, str(entry.get("on_error", "pass")),
                     hooks)


def _active(spec: CheckSpec, cfg: SiteConfig, ctx: Context) -> bool:
    policy = cfg.policy(spec.name)
    if not policy.enabled:
        return False
    hooks = policy.hooks or spec.hooks
    if ctx.hook in hooks:
        return True
    return ctx.hook == "epilog" and ctx.deep and "epilog_failed" in hooks


def _collectors(cfg: SiteConfig, ctx: Context, needed: set[str], apps: bool = True,
                nvlink_counters: bool = False, switches: list[str] | None = None,
                level: int = 0) -> dict[str, Callable]:
    expect = cfg.expect
    root = str(expect.get("sysfs_root") or "/")
    smi = str(expect.get("nvidia_smi") or "/usr/bin/nvidia-smi")
    makers: dict[str, Callable[[float], Any]] = {
        "gpu": lambda t: gpu.collect(expect, t, apps),
        "nvlink": lambda t: nvlink.collect_links(smi, t, nvlink_counters),
        "fabric": lambda t: nvlink.collect_fabric(smi, t, root, switches or []),
        # A diagnostic level has its own deadline, not the per-probe one (run() widens the
        # budget to it): level 2 takes minutes.
        "dcgm": lambda t: dcgm.collect(
            str(expect.get("dcgmi") or "/usr/bin/dcgmi"), level, dcgm.timeout_for(expect, level),
            expect.get("gpu_stress_argv") if ctx.hook == "burnin" else None),
        "rdma": lambda t: rdma.collect(  # link_downed history for rdma.link_flaps
            root, str(cfg.state_dir / f"link-downed.{safe_name(ctx.node)}.json"),
            float(expect.get("link_flap_window_h") or rdma.FLAP_WINDOW_H_DEFAULT) * 3600),
        "roce": lambda t: roce.collect(expect, t),
        "meminfo": lambda t: node.collect_meminfo(root),
        "disks": lambda t: node.collect_disks(list(expect.get("disks") or {})),
        # One cursor per node name: virtual nodes of one host keep apart.
        "kmsg": lambda t: xid.collect(
            str(expect.get("kmsg_source") or "/dev/kmsg"),
            str(cfg.state_dir / f"kmsg-cursor.{safe_name(ctx.node)}"), root,
            str(cfg.state_dir / "jobs"), ctx.node),
        "gpu_clocks": lambda t: clocks.collect(expect, t),
        amd.FACT: lambda t: amd.collect(expect, t),
        storage.FACT: lambda t: storage.collect(expect, t),
        "versions": lambda t: versions.collect(ctx.node, expect, t, ctx.hook, ctx.job_nodelist,
                                               gpu.enabled(expect)),
        "leftovers": lambda t: node.collect_leftovers(
            ctx.job_id, list(expect.get("leftover_ignore") or []), ctx.node),
    }
    for entry in expect.get("commands") or []:
        argv = [str(a) for a in entry["argv"]]
        limit = float(entry.get("timeout_s", cfg.runner["probe_timeout_s"]))
        makers[f"cmd:{entry['name']}"] = (
            lambda t, argv=argv, limit=limit: run_command(argv, min(t, limit)))
    return {key: makers[key] for key in needed if key in makers}


def gather(collectors: dict[str, Callable[[float], Any]], budget: float,
           probe_timeout: float) -> dict[str, Any]:
    """Run every collector in a daemon thread; a value or a ProbeError per key, on time."""
    start = time.monotonic()
    deadline = start + budget
    facts: dict[str, Any] = {}
    done = threading.Condition()

    def work(key: str, func: Callable[[float], Any]) -> None:
        try:
            value = func(max(0.05, min(probe_timeout, deadline - time.monotonic())))
        except ProbeError as exc:
            value = exc
        except Exception as exc:  # a bug in a collector must not kill the hook
            value = ProbeError(f"{key} collector crashed: {type(exc).__name__}: {exc}")
        with done:
            facts[key] = value
            done.notify_all()

    for key, func in collectors.items():
        threading.Thread(target=work, args=(key, func), name=f"probe-{key}", daemon=True).start()
    with done:
        while len(facts) < len(collectors):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(left)
        for key in collectors:
            facts.setdefault(key, ProbeError(f"{key} did not finish within the {budget:g} s "
                                             "budget"))
        return dict(facts)


def _judge(spec: CheckSpec, facts: dict[str, Any], cfg: SiteConfig, ctx: Context) -> CheckResult:
    fact = facts.get(spec.fact)
    begin = time.monotonic()
    if isinstance(fact, ProbeError):
        result = CheckResult(spec.name, FAIL if fact.node_fault else ERROR, str(fact))
    else:
        try:
            result = spec.func(fact, cfg.expect, ctx)
        except Exception as exc:  # a checker bug is an error of the checker, not the node
            result = CheckResult(spec.name, ERROR, f"check crashed: {type(exc).__name__}: {exc}")
    policy = cfg.policy(spec.name)
    status = result.status
    if policy.severity == "warn" and status == FAIL:
        status = WARN
    return replace(result, status=status, action=policy.action or "drain",
                   on_error=policy.on_error or spec.on_error,
                   seconds=time.monotonic() - begin)


def run(cfg: SiteConfig, ctx: Context) -> RunResult:
    """Gather what the active checks need and judge it; never raises for a broken node."""
    started, begin = time.time(), time.monotonic()
    specs = registry() + [_site_command_spec(e) for e in cfg.expect.get("commands") or []]
    has_gpus = gpu.enabled(cfg.expect)
    level = dcgm.level_for(cfg.expect, ctx.hook, ctx.deep)
    switches = nvlink.fabric_switches(cfg.expect) if has_gpus else None
    gates = {"gpu": has_gpus, "rdma": rdma.enabled(cfg.expect), "kmsg": has_gpus,
             "roce": roce.enabled(cfg.expect),
             "nvlink": has_gpus and nvlink.links_enabled(cfg.expect, switches),
             "fabric": switches is not None,
             "dcgm": has_gpus and level > 0,
             "gpu_clocks": has_gpus,
             "disks": bool(cfg.expect.get("disks")),
             "leftovers": bool(ctx.job_id),
             amd.FACT: amd.enabled(cfg.expect), storage.FACT: storage.enabled(cfg.expect)}
    specs = [s for s in specs if gates.get(s.fact, True) and _active(s, cfg, ctx)]
    needed = {s.fact for s in specs}
    if ctx.hook == "prolog" and gates["rdma"]:
        needed.add("rdma")  # the epilog's counter deltas need this job's starting point
    if ctx.hook == "prolog" and gates["roce"] and cfg.policy("rdma.roce_counters").enabled:
        needed.add("roce")  # and for the RoCE loss counters
    counters = any(s.name == "gpu.nvlink_errors" for s in specs)
    if ctx.hook == "prolog" and gates["nvlink"] and cfg.policy("gpu.nvlink_errors").enabled:
        needed.add("nvlink")  # the same for the NVLink error counters
        counters = True
    apps = any(s.name == "gpu.processes" for s in specs)
    budget = float(cfg.runner["budget_s"])
    if "dcgm" in needed:  # PrologEpilogTimeout must cover it too (docs/health.md, DCGM)
        budget = max(budget, dcgm.timeout_for(cfg.expect, level) + 5.0)
    facts = gather(_collectors(cfg, ctx, needed, apps, counters, switches, level), budget,
                   float(cfg.runner["probe_timeout_s"]))
    results = [_judge(s, facts, cfg, ctx) for s in specs]
    return RunResult(ctx, results, facts, time.monotonic() - begin, started)
