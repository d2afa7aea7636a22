"""DCGM diagnostics (``gpu.dcgm``): ``dcgmi diag -r LEVEL -j``, judged per GPU and test.

A level runs only where the site asks for it (``dcgm_levels``, per hook: e.g. 2 in the
epilog of a failed job, 3 in burn-in), with a deadline per level (``dcgm_timeout_s``). The
verdict comes from the JSON's per-GPU results, not from dcgmi's exit code: dcgmi exits 226
(DCGM_ST_NVVS_ERROR) or 205 (DCGM_ST_NVVS_ISOLATE_ERROR) after printing the whole report
(NVIDIA/DCGM issue 158), and in DCGM 4 even for an error of a test whose status is Pass.

Two JSON layouts exist (recorded outputs in tests/fixtures/health/dcgm/, sources in its
SOURCES.md): DCGM 3 puts the tests under ``"DCGM GPU Diagnostic"`` with ``gpu_ids`` (3.0-3.2)
or ``gpu_id`` (3.3) per result; DCGM 4 under ``"DCGM Diagnostic"`` with ``entity_group`` /
``entity_id`` per result and a ``metadata`` block. Both print only Pass, Skip and Fail.
"""

from __future__ import annotations

import json
import os

from slurmfabric._common.probe import ProbeError, run_command
from slurmfabric._common.textcheck import one_line
from slurmfabric.health.checks.gpu import gathered
from slurmfabric.health.family import (
    HOOKS,
    Fact,
    Family,
    Gathering,
    Key,
    number_problem,
    table_problem,
)
from slurmfabric.health.model import FAIL, OK, WARN, CheckResult

ROOT_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # 4.x, 3.x
# Seconds each level may take before it is killed (dcgmi diag's own run times are about
# 10 s, 2 min, 15-30 min and 1-2 h for levels 1-4 on an 8-GPU node).
DEFAULT_TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 2700.0, 4: 7200.0}
OK_EXITS = {0, 226, 205}  # a report was printed (226: a test failed; 205: isolate the GPU)


STATUSES = {"pass": "Pass", "fail": "Fail", "skip": "Skip", "warn": "Warn"}


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # "²".isdigit() is True, int("²") fails


def _gpus(result: dict) -> list[int | None]:
    """The GPUs one result is about: 4.x entity ids, 3.x ``gpu_id``/``gpu_ids`` strings."""
    if "entity_id" in result:
        entity = str(result["entity_id"])
        if result.get("entity_group", "GPU") != "GPU" or not _number(entity):
            return []
        return [int(entity[:6])]
    text = result.get("gpu_id", result.get("gpu_ids"))
    if text is None:
        return [None]  # a node-wide (Deployment) result
    return [int(x[:6]) for x in str(text).replace(" ", "").split(",") if _number(x)] or [None]


def _warnings(result: dict) -> list[str]:
    out = []
    items = result.get("warnings") or []
    # a plain string in some 3.x outputs (microsoft/VirtualClient's recorded Deployment failure)
    for item in [items] if isinstance(items, str) else items if isinstance(items, list) else []:
        # 3.x writes "warnings" instead of "warning" in one case (Deployment errors)
        text = item.get("warning", item.get("warnings")) if isinstance(item, dict) else item
        if text:
            out.append(" ".join(str(text).split()))
    return out


def parse(text: str) -> dict[str, object]:
    """``dcgmi diag -j`` output -> {"version", "results": [{category, test, gpu, status,
    warnings}]}; a banner before the JSON is skipped."""
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting past the limit
        raise ProbeError(f"dcgmi printed no JSON report ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise ProbeError("dcgmi printed no JSON report")
    root = next((data[k] for k in ROOT_KEYS if isinstance(data.get(k), dict)), None)
    if root is None:
        detail = data.get("runtime_error") or ", ".join(sorted(data))[:120]
        raise ProbeError(f"dcgmi report without results: {detail}")
    version = (_dict(data.get("metadata")).get("version") or data.get("version")
               or root.get("version"))
    results = []
    for category in _dicts(root.get("test_categories")):
        for test in _dicts(category.get("tests")):
            for result in _dicts(test.get("results")):
                for gpu in _gpus(result):
                    results.append({"category": category.get("category"),
                                    "test": test.get("name"), "gpu": gpu,
                                    "status": _status(result.get("status", "")),
                                    "warnings": _warnings(result)})
    return {"version": version, "results": results}


def _dict(item: object) -> dict:
    return item if isinstance(item, dict) else {}


def _dicts(items: object) -> list[dict]:
    """The objects of a JSON list: NVVS's own ``-j`` output leaves ``null`` between tests
    (the "real output" in NVIDIA/DCGM nvvs/src/tests/JsonResultTests.cpp, DCGM 3.1.0)."""
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _status(value: object) -> str:
    """dcgmi prints Pass/Fail/Skip, NVVS run directly PASS/FAIL/SKIP: one spelling."""
    text = str(value).strip()
    return STATUSES.get(text.lower(), text)


def level_for(expect: dict, hook: str, deep: bool) -> int:
    """The level this hook runs (0: none); a failed job's epilog may ask for more."""
    levels = expect.get("dcgm_levels") or {}
    level = int(levels.get(hook, 3 if hook == "burnin" else 0) or 0)
    if hook == "epilog" and deep:
        level = max(level, int(levels.get("epilog_failed", 0) or 0))
    return level


def timeout_for(expect: dict, level: int) -> float:
    return float((expect.get("dcgm_timeout_s") or {}).get(str(level),
                                                           DEFAULT_TIMEOUT_S.get(level, 600)))


def collect(dcgmi: str, level: int, timeout: float,
            argv: list[str] | None = None) -> dict[str, object]:
    """Run the level (or the site's stress ``argv``, which prints the same JSON)."""
    argv = list(argv or [dcgmi, "diag", "-r", str(level), "-j"])
    if not os.path.exists(argv[0]):
        raise ProbeError(f"{argv[0]} not found (install DCGM, or set dcgmi / gpu_stress_argv "
                         "in the site config)")
    out = run_command(argv, timeout, name=os.path.basename(argv[0]))
    if out.returncode not in OK_EXITS:
        last = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
        raise ProbeError(f"{' '.join(argv)[:80]} exit {out.returncode}: {last[:160]}")
    facts = parse(out.stdout)
    facts.update(level=level, exit=out.returncode, seconds=round(out.seconds, 1))
    return facts


def check_dcgm(facts: dict, expect: dict, ctx) -> CheckResult:
    """Fail on any Fail result (naming the test, the GPU and DCGM's own words); a report in
    which nothing ran (every result Skip) only warns."""
    results = list(facts.get("results") or [])
    jobs = getattr(ctx, "job_gpus", None)
    failed = [r for r in results if r["status"] == "Fail"
              and (jobs is None or r["gpu"] is None or r["gpu"] in jobs)]
    level = facts.get("level")
    values = {"level": level, "version": facts.get("version"), "exit": facts.get("exit"),
              "failed": [f"{r['test']}:{r['gpu']}" for r in failed],
              "passed": sum(r["status"] == "Pass" for r in results)}
    if failed:
        parts = []
        for r in failed[:3]:
            where = "" if r["gpu"] is None else f" on GPU{r['gpu']}"
            why = f": {r['warnings'][0][:100]}" if r["warnings"] else ""
            parts.append(f"{r['test']}{where}{why}")
        more = f" (+{len(failed) - 3} more)" if len(failed) > 3 else ""
        return CheckResult("gpu.dcgm", FAIL, f"DCGM level {level}: " + "; ".join(parts) + more,
                           values)
    if not any(r["status"] == "Pass" for r in results):
        return CheckResult("gpu.dcgm", WARN, f"DCGM level {level}: no test ran (all skipped)",
                           values)
    if facts.get("exit") not in (0, None):
        return CheckResult("gpu.dcgm", WARN, f"DCGM level {level}: every test passed but "
                           f"dcgmi exited {facts.get('exit')}", values)
    return CheckResult("gpu.dcgm", OK, "", values)


# name -> (function, default on_error, hooks). Fact key "dcgm"; it runs only in the hooks
# dcgm_levels names (the runner's gate), so the hooks here are every one.
CHECKS = {"gpu.dcgm": (check_dcgm, "pass", ("prolog", "epilog", "check", "periodic",
                                             "burnin"))}


def _levels_problem(value: object) -> str | None:
    """``dcgm_levels = {epilog_failed = 2, burnin = 3}``: hook -> level 0-4."""
    def entry(name: str, number: object) -> str | None:
        if name not in HOOKS:
            return f"dcgm_levels.{one_line(repr(name))}: not a hook; use {', '.join(HOOKS)}"
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= 4:
            return f"dcgm_levels.{name} = {one_line(repr(number))} should be a dcgmi diag level 0-4"
        return None

    return table_problem(value, "dcgm_levels", "{ epilog_failed = 2, burnin = 3 }", entry)


def _timeouts_problem(value: object) -> str | None:
    """``dcgm_timeout_s = {"2" = 900}``: level -> seconds, up to 4 h."""
    def entry(name: str, number: object) -> str | None:
        if name not in ("1", "2", "3", "4"):
            return f"dcgm_timeout_s.{one_line(repr(name))}: not a level; use \"1\" to \"4\""
        return number_problem(number, f"dcgm_timeout_s.{name}", False, (1, 14400))

    return table_problem(value, "dcgm_timeout_s", '{ "2" = 900 }', entry)


def _level(run: Gathering) -> int:
    return level_for(run.expect, run.ctx.hook, run.ctx.deep)


def _collect(run: Gathering, timeout: float) -> dict[str, object]:
    # A diagnostic level has its own deadline, not the per-probe one (the runner widens its
    # budget to it): level 2 takes minutes.
    level = _level(run)
    return collect(str(run.expect["dcgmi"]), level,
                   timeout_for(run.expect, level),
                   run.expect.get("gpu_stress_argv") if run.ctx.hook == "burnin" else None)


def _gate(run: Gathering) -> bool:
    return gathered(run) and _level(run) > 0


FAMILY = Family("dcgm", keys={
    "dcgmi": Key("/usr/bin/dcgmi"),
    "dcgm_levels": Key({}, check=_levels_problem),  # hook -> level, {epilog_failed = 2}
    "dcgm_timeout_s": Key({}, check=_timeouts_problem),  # "level" -> seconds
    "gpu_stress_argv": Key([], kind="strings"),  # burn-in: this instead of dcgmi (-j JSON)
}, facts=(Fact("dcgm", _collect, CHECKS, gate=_gate,
               # PrologEpilogTimeout must cover it too (docs/health.md, DCGM)
               budget=lambda run: timeout_for(run.expect, _level(run)) + 5.0),))
