"""``#SBATCH`` lines -> ``[job]`` fields (sbatch(1), "DESCRIPTION" and "OPTIONS").

sbatch reads ``#SBATCH`` lines until the first line that is neither a comment nor blank; a
line may hold several options, long (``--nodes=4``, ``--nodes 4``) or short (``-N4``,
``-N 4``). Which options are modelled comes from the single options table
(job/options.py ``OPTIONS``) plus the request fields agreed in issue 31; everything else
goes to ``job.extra_sbatch`` as written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Optional

from slurmfabric.job.options import OPTIONS

# sbatch(1) short options that take a value, by their long name.
SHORT = {
    "A": "account", "a": "array", "b": "begin", "C": "constraint", "c": "cpus-per-task",
    "D": "chdir", "d": "dependency", "e": "error", "F": "nodefile", "G": "gpus",
    "i": "input", "J": "job-name", "L": "licenses", "M": "clusters", "m": "distribution",
    "N": "nodes", "n": "ntasks", "o": "output", "p": "partition", "q": "qos",
    "S": "core-spec", "t": "time", "w": "nodelist", "x": "exclude",
}
# Short flags (no value).
SHORT_FLAGS = {"H": "hold", "I": "immediate", "k": "no-kill", "O": "overcommit",
               "Q": "quiet", "s": "oversubscribe", "v": "verbose", "W": "wait"}
# Long options that never take a separate value word.
FLAGS = frozenset({
    "exclusive", "requeue", "no-requeue", "hold", "overcommit", "oversubscribe", "wait",
    "contiguous", "no-kill", "spread-job", "use-min-nodes", "test-only", "parsable",
    "ignore-pbs", "quiet", "verbose", "get-user-env", "immediate", "reboot", "nvmps",
})
# Request fields agreed for issue 31 ([B]); once merged they are rows of OPTIONS too.
AGREED_FIELDS = frozenset({
    "gpus-per-task", "cpus-per-gpu", "mem-per-cpu", "mem-per-gpu", "wait-all-nodes",
    "ntasks-per-core", "exclude", "nodelist", "distribution", "hint",
})
# Every long option sbatch(1) documents (Slurm 22.05 and 24.11): sbatch reads a unique prefix
# of one as that option (getopt_long), so "--err=x" is "--error=x".
LONG = frozenset({
    "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir",
    "cluster-constraint", "clusters", "comment", "constraint", "container", "container-id",
    "contiguous", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
    "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error",
    "exclude", "exclusive", "export", "export-file", "extra", "extra-node-info",
    "get-user-env", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node",
    "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "help", "hint", "hold",
    "ignore-pbs", "immediate", "input", "job-name", "kill-on-invalid-dep", "licenses",
    "mail-type", "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu",
    "mincpus", "network", "nice", "no-kill", "no-requeue", "nodefile", "nodelist", "nodes",
    "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket",
    "oom-kill-step", "open-mode", "output", "overcommit", "oversubscribe", "parsable",
    "partition", "power", "prefer", "priority", "profile", "propagate", "qos", "quiet",
    "reboot", "requeue", "reservation", "resv-ports", "segment", "signal",
    "sockets-per-node", "spread-job", "switches", "test-only", "thread-spec",
    "threads-per-core", "time", "time-min", "tmp", "tres-bind", "tres-per-task", "uid",
    "usage", "use-min-nodes", "verbose", "version", "wait", "wait-all-nodes", "wckey", "wrap",
})
_INTS = frozenset({"nodes", "ntasks-per-node", "cpus-per-task", "gpus-per-task",
                   "cpus-per-gpu", "ntasks-per-core"})
# Modelled, but set by slurmfabric from other fields: kept raw.
_DERIVED_OPTIONS = frozenset({"signal", "open-mode", "requeue"})


@dataclass(frozen=True)
class Directive:
    line: int
    name: str  # long option name, without "--"
    value: Optional[str]  # None: a flag
    raw: str  # as written


def directives(text: str) -> tuple[list[Directive], list[tuple[int, str]]]:
    """The ``#SBATCH`` options sbatch reads, and the words it could not read as options."""
    out: list[Directive] = []
    bad: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break  # sbatch stops at the first command
        if not line.startswith("#SBATCH"):
            continue
        try:
            words = shlex.split(line[len("#SBATCH"):], comments=True)
        except ValueError:
            bad.append((number, line))
            continue
        i = 0
        while i < len(words):
            word = words[i]
            start = i
            i += 1
            if word.startswith("--"):
                name, eq, value = word[2:].partition("=")
                full = long_name(name)
                if full is None:
                    bad.append((number, word))
                    continue
                name = full
                if not eq and name not in FLAGS and i < len(words) \
                        and not words[i].startswith("-"):
                    value, eq = words[i], "="
                    i += 1
                out.append(Directive(number, name, value if eq else None,
                                     " ".join(words[start:i])))
            elif word.startswith("-") and len(word) >= 2 and word[1] in SHORT:
                value = word[2:].removeprefix("=")
                if not value and i < len(words):
                    value = words[i]
                    i += 1
                out.append(Directive(number, SHORT[word[1]], value, " ".join(words[start:i])))
            elif word.startswith("-") and len(word) == 2 and word[1] in SHORT_FLAGS:
                out.append(Directive(number, SHORT_FLAGS[word[1]], None, word))
            else:
                bad.append((number, word))
    return out, bad


def long_name(name: str) -> Optional[str]:
    """The sbatch option a long name stands for: itself, the one option it is a prefix of,
    None when it is a prefix of several (sbatch refuses it as ambiguous). A name sbatch does
    not document stays as written."""
    if name in LONG:
        return name
    matches = [option for option in LONG if option.startswith(name)] if name else []
    if len(matches) > 1:
        return None
    return matches[0] if matches else name


def modelled() -> dict[str, str]:
    """Long option -> ``[job]`` field, from the options table (an option's ``field`` where
    the table names one) and the agreed request fields."""
    out: dict[str, str] = {}
    for option in OPTIONS:
        if option.sbatch in _DERIVED_OPTIONS:
            continue
        field = getattr(option, "field", "") or "job." + option.sbatch.replace("-", "_")
        if field.startswith("job.") and "/" not in field:
            out[option.sbatch] = field[len("job."):]
    for name in AGREED_FIELDS:
        out.setdefault(name, name.replace("-", "_"))
    out["job-name"] = "name"
    return out


Notify = Callable[[int, str, str, str], None]  # line, kind, text, message


def job_fields(found: list[Directive], notify: Notify) -> tuple[dict[str, Any], dict[str, Any]]:
    """``[job]`` fields and other fields (``program.workdir``, ``launcher.signal``) for the
    directives; each directive is reported once (mapped, dropped or left raw)."""
    table = modelled()
    job: dict[str, Any] = {}
    other: dict[str, Any] = {}
    extra: list[str] = []
    ntasks: Optional[Directive] = None
    for d in found:
        raw = f"--{d.name}" + ("" if d.value is None else f"={d.value}")
        if d.name == "ntasks" and d.value is not None and d.value.isdigit():
            ntasks = d
            continue
        mapped = _special(d, job, other)
        if mapped is None and d.name in table:
            field = table[d.name]
            value: Any = d.value
            if d.name == "exclusive" and d.value is None:
                value = True
            elif d.name == "wait-all-nodes" and d.value in ("0", "1"):
                value = d.value == "1"
            elif d.name in _INTS and d.value is not None and d.value.isdigit():
                value = int(d.value)
            elif d.name in _INTS or d.value is None or d.name == "exclusive":
                value = None
            if value is not None:
                job[field] = value
                mapped = f"job.{field}"
        if mapped and mapped.startswith("dropped: "):
            notify(d.line, "dropped", d.raw, mapped.removeprefix("dropped: "))
        elif mapped and mapped.startswith("unmapped: "):
            notify(d.line, "unmapped", d.raw, mapped.removeprefix("unmapped: "))
            if d.name in ("image", "environment"):
                extra.append(raw)  # the request stays as written
        elif mapped:
            notify(d.line, "mapped", d.raw, mapped)
        else:
            extra.append(raw)
            notify(d.line, "mapped", d.raw, "job.extra_sbatch (not a modelled field)")
    if ntasks is not None:
        count = int(ntasks.value or 0)
        per = job.get("ntasks_per_node")
        if "nodes" not in job and isinstance(per, int) and count % per == 0:
            job["nodes"] = count // per  # sbatch: enough nodes for the tasks at that rate
            notify(ntasks.line, "mapped", ntasks.raw,
                   f"job.nodes = {count // per} ({count} tasks at {per} per node)")
        elif "nodes" not in job and count > 1:
            extra.append(f"--ntasks={count}")
            notify(ntasks.line, "unmapped", ntasks.raw, "--ntasks without --nodes: Slurm picks "
                   "the node count; slurmfabric's steps need job.nodes (kept as "
                   "job.extra_sbatch; set job.nodes and job.ntasks_per_node)")
        elif count % job.get("nodes", 1) == 0:
            nodes = job.get("nodes", 1)
            job.setdefault("ntasks_per_node", count // nodes)
            notify(ntasks.line, "mapped", ntasks.raw,
                   f"job.ntasks_per_node = {count // nodes} ({count} tasks on {nodes} nodes)")
        else:
            extra.append(f"--ntasks={count}")
            notify(ntasks.line, "mapped", ntasks.raw, "job.extra_sbatch (uneven over nodes)")
    if extra:
        job["extra_sbatch"] = extra
    return job, other


def _special(d: Directive, job: dict[str, Any], other: dict[str, Any]) -> Optional[str]:
    """Options whose meaning is a field of another shape (what they became, "dropped: why"),
    None when not special."""
    value = d.value
    if d.name in ("gres", "gpus-per-node") and value:
        gres = re.fullmatch(r"(?:gpu:)?(?:([A-Za-z0-9_.-]+):)?([0-9]+)", value) \
            if d.name == "gpus-per-node" else re.fullmatch(r"gpu(?::([A-Za-z0-9_.-]+))?:([0-9]+)",
                                                           value)
        if not gres:
            return None  # several gres, or not a GPU count: raw
        job["gpus_per_node"] = int(gres.group(2))
        fields = ["job.gpus_per_node"]
        if gres.group(1):
            job["gpu_type"] = gres.group(1)
            fields.append("job.gpu_type")
        if d.name == "gres":
            job["gpu_request"] = "gres"
            fields.append('job.gpu_request = "gres"')
        return ", ".join(fields)
    if d.name == "gpus-per-task" and value and value.isdigit():
        # The node's GPUs follow from the tasks per node ([job] computes them).
        job["gpus_per_task"], job["gpu_request"] = int(value), "gpus-per-task"
        return 'job.gpus_per_task, job.gpu_request = "gpus-per-task"'
    if d.name == "nodes" and value and re.fullmatch(r"[0-9]+-[0-9]+", value):
        low, high = value.split("-")
        job["nodes"] = int(low)
        return (f"unmapped: a node range; job.nodes is one count, so the job asks for exactly "
                f"{low} node(s) where Slurm could give up to {high}")
    if d.name in ("image", "environment") and value:
        what = "a Shifter image" if d.name == "image" else "a CSCS container environment (EDF)"
        return (f"unmapped: {what}; slurmfabric's config has no field for it (only pyxis: "
                "program.container_image), so the job would run outside it")
    if d.name == "requeue":
        job["requeue"] = True
        return "job.requeue"
    if d.name == "no-requeue":
        job["requeue"] = False
        return "job.requeue = false"
    if d.name == "chdir" and value is not None:
        if value in (".", "./"):
            return "dropped: the job starts in the submit directory anyway"
        other["workdir"] = value
        return "program.workdir"
    if d.name == "export" and value is not None and value.upper() == "ALL":
        return "dropped: sbatch exports the submit environment by default"
    if d.name == "signal" and value:
        sig = re.fullmatch(r"(?:SIG)?([A-Z0-9]+)@([0-9]+)", value)
        if sig:
            other["signal"], other["signal_seconds"] = sig.group(1), int(sig.group(2))
            return "launcher.signal, launcher.signal_seconds"
    return None

