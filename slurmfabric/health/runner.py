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

from slurmfabric._common.probe import ProbeError, run_command
from slurmfabric.health.families import FAMILIES
from slurmfabric.health.family import Fact, Gathering
from slurmfabric.health.model import ERROR, FAIL, WARN, CheckResult, Context, worst
from slurmfabric.health.siteconfig import SiteConfig

FACTS: tuple[Fact, ...] = tuple(fact for family in FAMILIES for fact in family.facts)
# Checks that judge events since the last run, not a state (health/family.Fact.events).
EVENT_CHECKS = frozenset(name for fact in FACTS for name in fact.events)


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
    return [CheckSpec(name, fact.name, func, on_error, hooks)
            for fact in FACTS for name, (func, on_error, hooks) in fact.checks.items()]


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


def _collectors(cfg: SiteConfig, run: Gathering, needed: set[str]) -> dict[str, Callable]:
    makers: dict[str, Callable[[float], Any]] = {
        fact.name: (lambda t, fact=fact: fact.collect(run, t)) for fact in FACTS}
    for entry in cfg.expect.get("commands") or []:
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
    probe = Gathering(cfg, ctx)
    gated = {fact.name for fact in FACTS if fact.gate(probe)}
    known = {fact.name for fact in FACTS}
    specs = [s for s in specs if (s.fact in gated or s.fact not in known)
             and _active(s, cfg, ctx)]
    gathering = Gathering(cfg, ctx, frozenset(s.name for s in specs), probe.memo)
    needed = {s.fact for s in specs}
    if ctx.hook == "prolog":  # the epilog's deltas start from the prolog's facts
        needed |= {f.name for f in FACTS if f.name in gated and f.baseline(gathering)}
    budget = float(cfg.runner["budget_s"])
    for fact in FACTS:
        if fact.name in needed and fact.budget is not None:
            budget = max(budget, fact.budget(gathering))
    facts = gather(_collectors(cfg, gathering, needed), budget,
                   float(cfg.runner["probe_timeout_s"]))
    results = [_judge(s, facts, cfg, ctx) for s in specs]
    return RunResult(ctx, results, facts, time.monotonic() - begin, started)
