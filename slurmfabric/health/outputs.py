"""What a run leaves behind: a JSON report, a Prometheus textfile, log and syslog lines.

Slurm discards hook stdout, so operators read the log file, syslog/journal and the JSON
report; monitoring reads the textfile (node_exporter's textfile collector), where link
rates, error counters and temperatures live next to each check's status.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from slurmfabric._common import files, prom
from slurmfabric.health.model import CheckResult, status_rank
from slurmfabric.health.siteconfig import SiteConfig


def report_dict(run: Any, drain: Any = None, exit_code: int = 0,
                note: str = "") -> dict[str, Any]:
    """The JSON report for tools: one object per run."""
    ctx = run.context
    return {
        "version": 1,
        "node": ctx.node,
        "hook": ctx.hook,
        "job_id": ctx.job_id,
        "deep": ctx.deep,
        "status": run.status,
        "exit_code": exit_code,
        "started": run.started,
        "seconds": round(run.seconds, 4),
        "checks": [r.to_dict() for r in run.results],
        "drain": None if drain is None else {"outcome": drain.outcome, "reason": drain.reason,
                                             "detail": drain.detail},
        "note": note,
        "host": socket.gethostname(),
    }


def write_report(cfg: SiteConfig, report: dict[str, Any]) -> Path:
    """``<report_dir>/<node>-<hook>-<job>-<time>-<pid>.json`` plus ``last-<node>.json``;
    keeps the newest ``keep_reports`` files per node."""
    directory = cfg.report_dir
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(report["started"]))
    node = files.safe_name(report["node"])
    job = files.safe_name(report["job_id"] or "nojob")
    path = directory / f"{node}-{report['hook']}-{job}-{stamp}-{os.getpid()}.json"
    files.write_json(path, report)
    files.write_json(directory / f"last-{node}.json", report)
    keep = int(cfg.runner.get("keep_reports") or 0)
    if keep > 0:  # concurrent hooks prune too: a file gone meanwhile is simply skipped
        mine = []
        for candidate in directory.glob(f"{node}-*.json"):
            with contextlib.suppress(OSError):
                mine.append((candidate.stat().st_mtime, candidate))
        for _mtime, old in sorted(mine)[:-keep]:
            with contextlib.suppress(OSError):
                old.unlink()
    return path


def prometheus_text(run: Any) -> str:
    """Textfile-collector format: per-check status plus every measured value."""
    node = run.context.node
    lines = [
        "# HELP slurmfabric_health_check_status Check status: 0 ok, 1 warn, 2 fail, 3 error.",
        "# TYPE slurmfabric_health_check_status gauge",
    ]
    for result in run.results:
        lines.append(f"slurmfabric_health_check_status"
                     f"{prom.labels(('node', node), ('check', result.check))} "
                     f"{status_rank(result.status)}")
    lines += [
        "# HELP slurmfabric_health_last_run_timestamp_seconds When the last hook ran.",
        "# TYPE slurmfabric_health_last_run_timestamp_seconds gauge",
        f"slurmfabric_health_last_run_timestamp_seconds"
        f"{prom.labels(('node', node), ('hook', run.context.hook))} {run.started:.3f}",
        "# HELP slurmfabric_health_run_seconds How long the checks took.",
        "# TYPE slurmfabric_health_run_seconds gauge",
        f"slurmfabric_health_run_seconds{prom.labels(('node', node),)} {run.seconds:.4f}",
    ]
    # The exposition format wants all samples of one metric together, after its TYPE line.
    samples: dict[str, list[str]] = {}
    for result in run.results:
        for metric in result.metrics:
            labels = (("node", node), *metric.labels)
            samples.setdefault(metric.name, []).append(
                f"{metric.name}{prom.labels(*labels)} {float(metric.value):g}")
    for name, group in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines.extend(group)
    return "\n".join(lines) + "\n"


def write_prometheus(cfg: SiteConfig, run: Any) -> Path | None:
    target = str(cfg.runner.get("prometheus_file") or "")
    if not target:
        return None
    path = Path(target.replace("{node}", run.context.node))
    prom.write_textfile(path, prometheus_text(run))
    return path


def log_lines(run: Any, drain: Any, exit_code: int) -> list[str]:
    ctx = run.context
    head = (f"slurmfabric health {ctx.hook} node={ctx.node} job={ctx.job_id or '-'} "
            f"status={run.status} exit={exit_code} seconds={run.seconds:.3f}")
    if drain is not None:
        head += f" drain={drain.outcome} reason={json.dumps(drain.reason)}"
        if drain.detail:
            head += f" detail={json.dumps(drain.detail)}"
    lines = [head]
    for result in run.results:
        if result.status != "ok":
            lines.append(f"slurmfabric health {ctx.hook} node={ctx.node} check={result.check} "
                         f"status={result.status} reason={json.dumps(result.reason)}")
    return lines


def write_hook_error(runner: dict[str, Any], node: str, hook: str, value: int) -> Path | None:
    """``slurmfabric_health_hook_error`` 1 when a hook failed open on its own fault, 0 after a
XX
    failed-open run does not erase the last real check results."""
    target = str(runner.get("prometheus_file") or "")
    if not target:
        return None
    base = target.replace("{node}", node)
    path = Path((base[:-5] if base.endswith(".prom") else base) + ".hook.prom")
    labels = prom.labels(("node", node), ("hook", hook))
    text = ("# HELP slurmfabric_health_hook_error 1: the last hook failed open on its own "
            "config or internal error (nothing was checked); 0: it ran.\n"
            "# TYPE slurmfabric_health_hook_error gauge\n"
            f"slurmfabric_health_hook_error{labels} {value}\n")
    try:
        prom.write_textfile(path, text)
    except OSError:
        return None
    return path


def log(cfg: SiteConfig, lines: list[str], worst_status: str) -> None:
    """Append to the log file and send to syslog (the journal on systemd nodes)."""
    log_raw(cfg.runner, lines, worst_status, syslog_too=True)


def log_raw(runner: dict[str, Any], lines: list[str], worst_status: str = "error",
            syslog_too: bool = False) -> None:
    """The log file part of ``log`` for a runner table that may be partial (fail-open)."""
    path = str(runner.get("log_file") or "")
    if path:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        text = "".join(f"{stamp} {line}\n" for line in lines)
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            # O_APPEND: concurrent hooks never interleave inside one write.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # syslog below still carries the lines
    if syslog_too and runner.get("syslog"):
        import syslog

        priority = {"ok": syslog.LOG_INFO, "warn": syslog.LOG_WARNING}.get(
            worst_status, syslog.LOG_ERR)
        syslog.openlog("slurmfabric-health", syslog.LOG_PID, syslog.LOG_DAEMON)
        for line in lines:
            syslog.syslog(priority, line)
        syslog.closelog()


def table(results: list[CheckResult]) -> str:
    """The human table printed by ``slurmfabric health check``."""
    rows = [("CHECK", "STATUS", "REASON")]
    rows += [(r.check, r.status.upper(), r.reason or "-") for r in results]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{c.ljust(width)}  {s.ljust(6)}  {why}" for c, s, why in rows)


NPD_MAX_OUTPUT = 80  # node-problem-detector custom plugins: maxOutputLength's default


def kubernetes_condition(run: Any) -> tuple[str, dict]:
    """(the line a node-problem-detector custom plugin prints, a NodeCondition dict).

    NPD's script interface (kubernetes/node-problem-detector custom plugin monitor): exit
    0 no problem, 1 a problem, anything else unknown, and a message on stdout cut at
    maxOutputLength (80 by default); the condition's reason is CamelCase, as Kubernetes
    condition reasons are (API conventions)."""
    blocking = list(run.blocking)
    if blocking:
        first = blocking[0]
        reason = "".join(part.capitalize() for part in
                         first.check.replace(".", "_").split("_"))
        message = f"{first.check}: {first.reason}" + (
            f" (+{len(blocking) - 1} more)" if len(blocking) > 1 else "")
    else:
        reason, message = "ChecksPassed", f"{len(run.results)} checks passed"
    line = message if len(message) <= NPD_MAX_OUTPUT else message[:NPD_MAX_OUTPUT - 3] + "..."
    condition = {"type": "SlurmfabricHealthy", "status": "False" if blocking else "True",
                 "reason": reason, "message": message[:1024]}
    return line, condition
