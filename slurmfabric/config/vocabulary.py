"""The words a config uses that other layers read too: launchers, resume events, and the
Slurm options vocabulary (each sbatch(1) option's name, its other spellings and the config
field that owns it).

It lives here, below job/ and restart/, so the model checks its own ``job.extra_sbatch``
lines without importing upward; job/options.py adds each option's values for the sbatch
script, pyslurm and Kubernetes. Standard library only: restart/ and commands read it
without loading pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LAUNCHERS = ("torchrun", "srun", "mpirun", "srun-pmix", "nccl-tests")
# What a job can be made to survive ([launcher.resume] events). hang and slow come from the
# ranks' heartbeats (slurmfabric.progress): a hang past hang_timeout, a rank persistently
# slow_ratio times slower than its peers.
RESUME_EVENTS = ("timeout", "preempt", "node_fail", "worker_fail", "hang", "slow")

JobSection = Any  # sections.job.JobSection: read by attribute only, so no import cycle
LauncherSection = Any  # sections.launcher.LauncherSection


def _always(_value: str, _job: JobSection, _launcher: LauncherSection) -> bool:
    return True


@dataclass(frozen=True)
class OptionName:
    """One Slurm option as a config sees it: its sbatch(1) long name, the field that sets it
    and the other spellings of the same request (short letters, related long names), so
    that a raw ``job.extra_sbatch`` line that would set it too is refused (``clashes``
    narrows that when the option sets only part of what its name covers, like ``--gres``)."""

    sbatch: str  # sbatch(1) long option, without "--"
    field: str = ""  # default: job.<sbatch name with '_'>
    aliases: tuple[str, ...] = ()
    clashes: Callable[[str, JobSection, LauncherSection], bool] = _always

    @property
    def owner(self) -> str:
        """The config field (or fields, '/'-joined) that sets this option."""
        return self.field or "job." + self.sbatch.replace("-", "_")


def _gpu_gres(value: str, job: JobSection, _launcher: LauncherSection) -> bool:
    """Only a GPU gres clashes (``--gres=nvme:1`` adds another resource), unless the job's
    own GPUs are a --gres, which a second --gres line would replace (sbatch keeps the last)."""
    return job.gpu_request == "gres" or "gpu" in value.lower()


# Each sbatch(1) long option slurmfabric models, with its other spellings (short letters,
# related long names).
_SPELLINGS: dict[str, tuple[str, ...]] = {
    "job-name": ("J",), "nodes": ("N",), "ntasks-per-node": ("ntasks", "n", "ntasks-per-gpu"),
    "gpus-per-node": ("gpus", "G", "gpus-per-socket"), "gres": (), "gpus-per-task": (),
    "partition": ("p",), "account": ("A",), "qos": ("q",), "time": ("t",), "mem": (),
    "mem-per-cpu": (), "mem-per-gpu": (), "cpus-per-task": ("c",), "cpus-per-gpu": (),
    "constraint": ("C",), "reservation": (), "output": ("o",), "error": ("e",),
    "array": ("a",), "dependency": ("d",), "mail-type": (), "mail-user": (), "exclusive": (),
    "requeue": ("no-requeue",), "signal": (), "open-mode": (), "wait-all-nodes": (),
    "ntasks-per-core": (), "exclude": ("x",), "nodelist": ("w",), "distribution": ("m",),
    "hint": (),
}
# The owners that are not job.<name with '_'>: several fields, or another section.
_GPU_FIELD = "job.gpus_per_node/job.gpu_request"
_OWNERS = {"job-name": "job.name", "gpus-per-node": _GPU_FIELD, "gres": _GPU_FIELD,
           "gpus-per-task": "job.gpus_per_task/job.gpu_request",
           "signal": "launcher.signal/launcher.resume", "open-mode": "launcher.resume"}
_CLASHES: dict[str, Callable[[str, JobSection, LauncherSection], bool]] = {
    "gres": _gpu_gres,
    "signal": lambda _v, _j, launcher: bool(launcher.signal or launcher.resume.enabled),
    "open-mode": lambda _v, _j, launcher: launcher.resume.enabled,
}
NAMES: tuple[OptionName, ...] = tuple(
    OptionName(name, _OWNERS.get(name, ""), aliases, _CLASHES.get(name, _always))
    for name, aliases in _SPELLINGS.items())
BY_SBATCH = {name.sbatch: name for name in NAMES}

# The JobSection fields a [[job.components]] entry may set: what Slurm allocates per
# component of a heterogeneous job. The others (name, time, output, requeue, ...) are
# job-wide: set once in [job], which Slurm propagates to every component
# (https://slurm.schedmd.com/heterogeneous_jobs.html, "Submitting Jobs").
COMPONENT_FIELDS = frozenset({
    "nodes", "ntasks_per_node", "gpus_per_node", "gpu_request", "gpus_per_task", "gpu_type",
    "cpus_per_task", "cpus_per_gpu", "mem", "mem_per_cpu", "mem_per_gpu", "partition",
    "account", "qos", "constraint", "reservation", "exclusive", "exclude", "nodelist",
    "ntasks_per_core", "distribution", "hint",
})

# sbatch(1) options that are a proper prefix of a modelled name but options of their own
# (getopt_long takes any unambiguous prefix of a long option, so other prefixes would be
# an abbreviation of a modelled option, or ambiguous).
_OWN_OPTIONS = frozenset({"wait"})


def split_extra(line: str) -> tuple[str, str]:
    """``--opt=v``, ``--opt v``, ``-N 4``, ``-N4`` -> (option name, value)."""
    if line.startswith("--"):
        name = line[2:].split("=", 1)[0].split(None, 1)[0] if line[2:].strip() else ""
        return name, line[2 + len(name):].lstrip("= \t")
    return line[1:2], line[2:].lstrip(" \t")


def modelled(name: str) -> list[OptionName]:
    """The options a raw sbatch option name would set (an abbreviation: every one it could
    stand for)."""
    exact = [o for o in NAMES if name == o.sbatch or name in o.aliases]
    if exact or len(name) < 2 or name in _OWN_OPTIONS:
        return exact
    return [o for o in NAMES if any(n.startswith(name) for n in (o.sbatch, *o.aliases)
                                    if len(n) > 1)]


def extra_sbatch_problems(job: JobSection, launcher: LauncherSection) -> list[str]:
    """Raw ``job.extra_sbatch`` lines that set what a modelled field sets: both would reach
    sbatch and the script's own counts would disagree with the allocation (sbatch keeps
    the last of two lines)."""
    out = []
    for line in job.extra_sbatch:
        name, value = split_extra(line)
        clashing = [o for o in modelled(name) if o.clashes(value, job, launcher)]
        if not clashing:
            continue
        fields = " or ".join(dict.fromkeys(o.owner for o in clashing))
        current = [f"{o.owner} = {getattr(job, o.owner[4:])!r}" for o in clashing
                   if o.owner.startswith("job.") and "/" not in o.owner
                   and getattr(job, o.owner[4:], None) not in (None, False)]
        now = f" ({', '.join(current)})" if current else ""
        abbreviated = "" if any(name in (o.sbatch, *o.aliases) for o in clashing) else \
            " (an abbreviation sbatch expands)"
        out.append(f"job.extra_sbatch: {line!r}{abbreviated} sets what {fields} sets{now}; "
                   f"accepted: the field {fields} instead of this line")
    return out
