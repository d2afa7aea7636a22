"""Typed results shared by every check, the runner and the outputs.

A check is a small pure function over gathered facts that returns a ``CheckResult``; it never
logs, drains or exits. Statuses are ordered so the worst one decides what the hook does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

OK = "ok"
WARN = "warn"
FAIL = "fail"
ERROR = "error"  # the checker itself could not decide (probe timed out, tool missing ...)

STATUSES = (OK, WARN, FAIL, ERROR)
_RANK = {OK: 0, WARN: 1, FAIL: 2, ERROR: 3}

Value = Union[int, float, str, bool, None]


def status_rank(status: str) -> int:
    """0 ok, 1 warn, 2 fail, 3 error: the order used in reports and Prometheus."""
    return _RANK[status]


@dataclass(frozen=True)
class Metric:
    """One Prometheus sample a check measured (link rate, counter, temperature ...)."""

    name: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CheckResult:
    """What one check found: status, a short reason (goes into the drain reason), values."""

    check: str
    status: str
    reason: str = ""
    values: dict[str, Value] = field(default_factory=dict)
    metrics: tuple[Metric, ...] = ()
    # Filled in by the runner from the site config, not by the check itself.
    action: str = "drain"
    on_error: str = "fail"
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in _RANK:
            raise ValueError(f"unknown status {self.status!r}; use one of {STATUSES}")

    @property
    def blocking(self) -> bool:
        """True when this result should stop the node: a fail, or an error of a fail-closed
        check. Warnings and fail-open errors are reported only."""
        if self.status == FAIL:
            return True
        return self.status == ERROR and self.on_error == "fail"

    def to_dict(self) -> dict[str, object]:
        return {
            "check": self.check,
            "status": self.status,
            "reason": self.reason,
            "values": dict(self.values),
            "action": self.action,
            "on_error": self.on_error,
            "blocking": self.blocking,
            "seconds": round(self.seconds, 4),
        }


def ok(check: str, reason: str = "", **values: Value) -> CheckResult:
    return CheckResult(check, OK, reason, values)


def worst(results: list[CheckResult]) -> str:
    """The worst status of a run (``ok`` for no results)."""
    return max((r.status for r in results), key=status_rank, default=OK)


@dataclass(frozen=True)
class Context:
    """Where and why the checks run: the hook, the node, and the job (from Slurm's env)."""

    hook: str  # "prolog" | "epilog" | "check"
    node: str
    job_id: str | None = None
    job_gpus: frozenset[int] | None = None  # physical GPU indices of the job, if gres/gpu
    deep: bool = False  # epilog after a failed job, or `health check --deep`
    counters_before: dict | None = None  # RDMA counters from this job's prolog
    nvlink_before: dict | None = None  # NVLink error counters from this job's prolog
    roce_before: dict | None = None  # RoCE loss/pause counters from this job's prolog
    job_nodelist: str | None = None  # SLURM_JOB_NODELIST: node.version_skew's peers

    @classmethod
    def from_env(cls, hook: str, node: str, env: dict[str, str], deep: bool = False,
                 scope_gpus: bool = True) -> Context:
        """Read SLURM_JOB_ID, SLURM_JOB_GPUS (else CUDA_VISIBLE_DEVICES) and, in the epilog,
        SLURM_JOB_DERIVED_EC / SLURM_JOB_EXIT_CODE to decide on deeper checks."""
        gpus = None
        text = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES")
        if scope_gpus and text is not None:
            try:
                gpus = frozenset(int(x) for x in text.split(",") if x.strip())
            except ValueError:  # UUIDs or MIG names: do not guess, check every GPU
                gpus = None
        if hook == "epilog":
            # DERIVED_EC and EXIT_CODE are wait statuses (256 = exit 1); EXIT_CODE2 is
            # "exit:signal". Any non-zero part means the job failed: look deeper.
            for key in ("SLURM_JOB_DERIVED_EC", "SLURM_JOB_EXIT_CODE", "SLURM_JOB_EXIT_CODE2"):
                parts = env.get(key, "0").split(":")
                if any(p.strip() not in ("", "0") for p in parts):
                    deep = True
        return cls(hook, node, env.get("SLURM_JOB_ID") or None, gpus, deep,
                   job_nodelist=env.get("SLURM_JOB_NODELIST") or None)
