"""The prolog/epilog entry: run the checks, drain on failure, write every output.

The same run serves slurm.conf's HealthCheckProgram (``periodic``): no job, only the checks
whose hooks include "periodic", and the drain by itself (slurmd ignores the exit code). Exit
codes follow the contract in ``hookscript``: ``EXIT_NODE_BAD`` (100) only when the checks ran
and found the node bad, after we set our precise reason (Slurm keeps it instead of "Prolog
error"); the wrapper turns that into Slurm's non-zero, which drains the node and requeues
the job. Only a failing *check* may drain. slurmfabric's own faults fail open, decided here
(``fail_open``) for what Python can still see, and in the wrapper for what it cannot (a
missing binary, a broken install, a crash): exit 0, one line to syslog and the hook log, and
the Prometheus gauge ``slurmfabric_health_hook_error`` set to 1 so alerting sees it; a
cluster-wide config typo must never drain every node at the next job. ``health check``
reports the same config error with exit 2. A state lock that cannot be taken is logged as an
error and sets the gauge; it drains only when the checks failed.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

from slurmfabric._common import files
from slurmfabric.errors import ConfigError, HealthError
from slurmfabric.health import drain, outputs, runner, siteconfig, state
from slurmfabric.health.checks import nvlink, roce
from slurmfabric.health.checks.rdma import RdmaFacts, snapshot
from slurmfabric.health.hookscript import EXIT_NODE_BAD
from slurmfabric.health.model import Context


def node_name(env: Mapping[str, str]) -> str:
    """SLURMD_NODENAME (set by slurmd, also for virtual nodes), else the short hostname."""
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _set_path(cfg: siteconfig.SiteConfig) -> None:
    """Hooks run with no PATH (or a minimal one): put Slurm's bin dir first for scontrol,
    and point it at ``slurm_conf`` when the site config names one."""
    bin_dir = str(cfg.runner.get("slurm_bin_dir") or "")
    path = os.environ.get("PATH") or os.defpath
    if bin_dir and bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + path
    elif "PATH" not in os.environ:
        os.environ["PATH"] = path
    if cfg.runner.get("slurm_conf"):  # slurmd gives HealthCheckProgram no SLURM_CONF
        os.environ["SLURM_CONF"] = str(cfg.runner["slurm_conf"])


def _emergency(message: str) -> None:
    """Report a failure that happens before the config (and so the log file) is known."""
    import syslog

    syslog.openlog("slurmfabric-health", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_ERR, message)
    print(message, file=sys.stderr)


def _detail(blocking: list) -> str:
    first = blocking[0]
    detail = first.reason or first.status
    if len(blocking) > 1:
        detail += f" (+{len(blocking) - 1} more: {', '.join(r.check for r in blocking[1:])})"
    return detail


def fail_open(hook: str, node: str, what: str, error: BaseException,
              cfg: siteconfig.SiteConfig | None = None, config: str | None = None) -> int:
    """slurmfabric's own fault, not the node's: log it everywhere we can, exit 0."""
    text = " ".join(str(error).split()) or type(error).__name__
    if not isinstance(error, ConfigError):
        text = f"{type(error).__name__}: {text}"
    message = f"slurmfabric health {hook} node={node}: {what}, NOT draining (fail-open): {text}"
    _emergency(message)
    runner_cfg = cfg.runner if cfg is not None else siteconfig.salvage_runner(config)
    outputs.log_raw(runner_cfg, [message])
    outputs.write_hook_error(runner_cfg, node, hook, 1)
    return 0


PERIODIC = "periodic"


def run_hook(hook: str, config: str | None = None,
             env: Mapping[str, str] | None = None) -> int:
    """Run the ``prolog``, ``epilog`` or ``periodic`` hook for this node; return the exit
    code. ``periodic`` is slurm.conf's HealthCheckProgram: Slurm ignores its exit code, so
    it drains by itself exactly like the prolog."""
    env = os.environ if env is None else env
    node = node_name(env)
    try:
        cfg = siteconfig.load(node, config)
    except ConfigError as exc:
        return fail_open(hook, node, "config error", exc, config=config)
    except Exception as exc:  # a bug in reading the config is still not the node's fault
        return fail_open(hook, node, "internal error reading the config", exc, config=config)
    try:
        return _run_hook(hook, cfg, node, env)
    except Exception as exc:
        return fail_open(hook, node, "internal error", exc, cfg=cfg)


def _run_hook(hook: str, cfg: siteconfig.SiteConfig, node: str,
              env: Mapping[str, str]) -> int:
    _set_path(cfg)
    if hook == PERIODIC:  # no job: slurmd runs it on idle and allocated nodes alike
        ctx = Context(hook, node)
    else:
        ctx = Context.from_env(hook, node, dict(env),
                               scope_gpus=bool(cfg.runner["scope_to_job_gpus"]))
    job_path = state.job_file(cfg.state_dir, node, ctx.job_id) if ctx.job_id else None
    if hook == "epilog" and job_path is not None:
        saved = files.read_json_or_none(job_path)
        if isinstance(saved, dict):
            ctx = Context(ctx.hook, ctx.node, ctx.job_id, ctx.job_gpus, ctx.deep,
                          saved.get("counters"), saved.get("nvlink"), saved.get("roce"))
    run = runner.run(cfg, ctx)
    blocking = [r for r in run.blocking if r.action == "drain"]
    outcome, exit_code, note = None, 0, ""
    try:
        with state.locked(cfg.state_dir, float(cfg.runner["lock_timeout_s"])):
            if hook == "prolog" and job_path is not None:
                # The epilog's counter deltas start here, and gpu.xid attributes an Xid to
                # the jobs whose file exists (prolog to epilog) by this start time.
                rdma_facts = run.facts.get("rdma")
                files.write_json(job_path, {
                    "job_id": ctx.job_id, "node": node, "time": run.started,
                    "counters": snapshot(rdma_facts) if isinstance(rdma_facts, RdmaFacts)
                    else None, "nvlink": nvlink.snapshot(run.facts.get("nvlink")),
                    "roce": roce.snapshot(run.facts.get("roce"))})
            elif hook == "epilog" and job_path is not None:
                job_path.unlink(missing_ok=True)
            if blocking:
                exit_code = EXIT_NODE_BAD
                policy = drain.DrainPolicy.from_site(cfg)
                if policy.enabled:
                    outcome = drain.drain(node, blocking[0].check, _detail(blocking), policy)
                    if outcome.outcome == drain.BREAKER:
                        exit_code = 0  # fail-open: Slurm would drain it as "Prolog error"
            else:
                _clear_stale(cfg, node, run)
        hook_error = 0
    except HealthError as exc:  # lock timeout: loud, but only a failed check drains
        exit_code, note, hook_error = (EXIT_NODE_BAD if blocking else 0), str(exc), 1
    except OSError as exc:  # unwritable state dir: still decide on the checks
        note, hook_error = f"could not write state/report: {exc}", 0
    # The report, the gauge and the textfile need no lock (unique or atomically replaced
    # files): a hook that waited too long for the lock still leaves its report.
    try:
        outputs.write_report(cfg, outputs.report_dict(run, outcome, exit_code, note))
        outputs.write_prometheus(cfg, run)
        outputs.write_hook_error(cfg.runner, node, hook, hook_error)
    except OSError as exc:
        note = note or f"could not write state/report: {exc}"
    lines = outputs.log_lines(run, outcome, exit_code)
    if note:
        lines.append(f"slurmfabric health {hook} node={node}: {note}")
    outputs.log(cfg, lines, "error" if note else run.status)
    return exit_code


def _clear_stale(cfg: siteconfig.SiteConfig, node: str, run: runner.RunResult) -> None:
    """All checks pass: a drain record from before this run is stale (a prolog only runs
    on a node that takes jobs). With auto_resume, resume a node we drained, but only when
    the check that drained it ran now and passed, and it judges a state (ECC, a link), not
    an event: gpu.xid or a counter delta passes on the next run without any repair."""
    record = drain.remembered(node, cfg.state_dir)
    if record is None:
        return
    if cfg.runner.get("auto_resume"):
        check = drain.reason_check(str(record.get("reason", "")))
        passed = {r.check for r in run.results if not r.blocking}
        if check in passed and check not in runner.EVENT_CHECKS:
            try:
                drain.resume_if_ours(node, drain.DrainPolicy.from_site(cfg))
            except Exception:  # never let a resume attempt fail a healthy hook
                return
        return
    if run.context.hook != PERIODIC and float(record.get("time", 0)) < run.started:
        drain.forget(node, cfg.state_dir)


def burn_in(node: str, config: str | None, results: str | None = None) -> tuple[dict, int]:
    """The GPU stage of a burn-in (``pairs submit --burn-in --gpu-stage``): DCGM level 3, or
    the site's ``gpu_stress_argv``, judged per GPU. Fail-closed, unlike the hooks: a stage
    that could not run (no dcgmi, a timeout) fails, since passing it returns a repaired node
    to service. Writes ``gpu-<node>.json`` into ``results`` for 'pairs report'."""
    cfg = siteconfig.load(node, config)
    _set_path(cfg)
    run = runner.run(cfg, Context("burnin", node))
    ran = [r for r in run.results if r.check == "gpu.dcgm"]
    failed = [r for r in run.results if r.status in ("fail", "error")]
    exit_code = 1 if failed or not ran else 0
    report = outputs.report_dict(run, None, exit_code)
    if not ran:
        report["reason"] = "no GPU stage ran: this node has no GPUs configured or found"
    elif failed:
        report["reason"] = f"{failed[0].check}: {failed[0].reason or failed[0].status}"
    if results:
        files.write_json(os.path.join(results, f"gpu-{files.safe_name(node)}.json"), report)
    return report, exit_code


def check(node: str, config: str | None, deep: bool = False,
          env: Mapping[str, str] | None = None) -> runner.RunResult:
    """Run the checks by hand (no drain, no state): what ``health check`` prints."""
    cfg = siteconfig.load(node, config)
    _set_path(cfg)
    ctx = Context.from_env("check", node, dict(os.environ if env is None else env), deep=deep,
                           scope_gpus=False)
    return runner.run(cfg, ctx)




__all__ = ["burn_in", "check", "node_name", "run_hook", "HealthError"]
