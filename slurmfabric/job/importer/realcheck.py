"""``slurmfabric import --check`` on real Slurm: both scripts run as batch jobs on the testbed.

The original script and the one the config renders are submitted with the real ``sbatch`` to
the local testbed (``slurmfabric testbed``), where the real slurmctld, slurmd, ``srun`` and
slurmstepd run them. Only the *programs* are stand-ins: a small bash script, first on
``PATH`` in both jobs under every name a training job starts (python, torchrun, accelerate,
deepspeed, the nccl-tests binaries, container runtimes, ...), writes one record per call:
its argv, working directory, environment, node, step, ``SLURM_PROCID``/``SLURM_LOCALID``.
Any other command the script names that is not on ``PATH`` is recorded the same way (bash's
``command_not_found_handle``) and not run. What is compared, step by step: the nodes and
tasks per node of each step, what each task executed (argv, working directory), the
environment the program sees, the commands the batch shell ran and their order, the
errors ``srun`` printed, and the job's exit code.

What the testbed cannot grant (GPUs, memory, a site's partition, account, QOS,
reservation, constraints, node names, a shifter image or a CSCS environment) is compared
as requested text (check.py ``compare_request``) and then neutralised the same way in both
scripts before they run (``neutralise``): dropped, node counts capped at the testbed's,
the time limit and output paths replaced. Nothing here reads the renderer's option tables:
the few sbatch options this module rewrites are named here, from sbatch(1).
"""

from __future__ import annotations

import difflib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from slurmfabric.job.importer.check import SAFE_TOOLS, CheckReport, compare_request
from slurmfabric.job.render import flight_recorder_names
from slurmfabric.job.zipapp import CONTAINER_PATH

# sbatch(1) options whose request the testbed cannot grant: compared as text, then dropped
# from both scripts. Every one takes a value (sbatch(1) synopsis).
_DROP_LONG = ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket", "gpu-bind",
              "gpu-freq", "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu", "partition",
              "account", "qos", "reservation", "constraint", "cluster-constraint", "clusters",
              "nodelist", "exclude", "output", "error", "input", "chdir", "time", "time-min",
              "image", "module", "volume", "environment", "uenv", "view",
              # pyxis's (https://github.com/NVIDIA/pyxis, args.c) and Slurm's OCI ones
              "container", "container-id", "container-image", "container-mounts",
              "container-name", "container-workdir", "container-save", "container-env",
              "container-unshare", "mail-type",
              "mail-user", "dependency", "licenses", "switches", "export", "comment",
              "begin", "deadline", "network", "tmp", "core-spec", "thread-spec", "wckey")
_DROP_FLAGS = ("get-user-env", "hold", *(f"{no}container-{name}" for no in ("", "no-") for name in
               ("writable", "readonly", "remap-root", "mount-home", "entrypoint",
                "entrypoint-log")))
# Short forms with a value (sbatch(1)): -p -A -q -C -w -x -o -e -i -D -t -G -M -L -d.
_DROP_SHORT = "pAqCwxoeiDtGMLd"
_NODES = ("nodes",)
# Programs the stand-in answers for. Each call is recorded; none runs.
PROGRAMS = ("python", "python3", "torchrun", "accelerate", "deepspeed", "tune", "lightning",
            "nsys", "ncu", "numactl", "singularity", "apptainer", "shifter", "enroot",
            "docker", "podman", "podman-hpc", "sarus", "ch-run", "nvidia-smi", "dcgmi",
            "sleep", "pip", "pip3", "conda", "mamba", "git", "wget", "curl", "rm", "cp", "mv",
            "mkdir", "ln", "touch", "chmod", "tar", "sbatch", "scancel", "ps", "kill", "pkill",
            *(f"{op}_perf" for op in ("all_reduce", "all_gather", "alltoall", "broadcast",
                                      "reduce_scatter", "reduce", "scatter", "gather",
                                      "sendrecv", "hypercube")))
# Real tools the jobs may run besides SAFE_TOOLS: Slurm's own client commands.
_SLURM_TOOLS = ("srun", "scontrol", "sinfo", "squeue", "sacct", "mpirun", "mpiexec")
_STANDIN = r"""#!/bin/bash
# Recording stand-in (slurmfabric import --check): one record per call, nothing run. Only
# builtins and absolute paths here: mkdir, env and the rest are stand-ins on PATH too.
# A container runtime's command, and slurmfabric's zipapp, run here (containers.sh).
case ${0##*/} in
  python|python3|python3.*)
    [[ ${1:-} == */slurmfabric.pyz || ${1:-} == */slurmfabric-*.pyz ]] && \
      { shift; exec @ROOT@/tools/slurmfabric "$@"; } ;;
  apptainer|singularity|shifter|enroot)
    . @ROOT@/containers.sh && sf_unwrap "${0##*/}" "$@" ;;
esac
r="$SF_REC_DIR/$(printf '%s.%s.%s.%s' "${EPOCHREALTIME/./}" "${SLURM_STEP_ID:-batch}" \
  "${SLURM_PROCID:--}" "$$")"
/bin/mkdir -p "$r" || exit 0
printf '%s\0' "$@" > "$r/argv"
printf '%s' "$0" > "$r/prog"
printf '%s' "$PWD" > "$r/cwd"
printf '%s' "${SLURMD_NODENAME:-}" > "$r/node"
printf '%s' "${SLURM_LOCALID:--}" > "$r/localid"
/usr/bin/env -0 > "$r/env"
exit 0
"""
_PRELUDE = 'command_not_found_handle() { "$SF_STANDIN" "$@"; }\n'

# Environment not compared: Slurm's, slurmfabric's own, the MPI/torch launchers' rank
# variables, the shell's bookkeeping, and what the check itself sets.
_SKIP_PREFIX = ("SLURM", "SLURMD_", "SLURMFABRIC_", "OMPI_", "PMIX_", "PMI_", "TORCHELASTIC_",
                "BASH_FUNC_", "SF_", "ENVIRONMENT")
_SKIP = frozenset({"_", "SHLVL", "PWD", "OLDPWD", "BASH_ENV", "MASTER_ADDR", "MASTER_PORT",
                   "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
                   "GROUP_RANK", "ROLE_RANK", "RDZV_ID", "RDZV_PORT", "NNODES",
                   "NPROC_PER_NODE", "sf_bin", "sf_check",
                   "slurmfabric_job_env", "TMPDIR", "CUDA_VISIBLE_DEVICES",
                   "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "HOSTNAME"})
_ADDED_DEFAULTS = flight_recorder_names()
# torchrun options slurmfabric derives (node count, node rank, rendezvous); flags without a
# value (torch/distributed/run.py argparse: store_true). Every other option takes a value.
_TORCHRUN_DERIVED = frozenset({"nnodes", "node-rank", "rdzv-backend", "rdzv-endpoint",
                               "rdzv-id", "rdzv-conf", "master-addr", "master-port",
                               "standalone", "max-restarts"})
_TORCHRUN_FLAGS = frozenset({"standalone", "no-python", "run-path", "module", "m"})
# A job that waits in a loop on something a stand-in does not do (a file, a port, a
# process) records the same commands until its time limit: compared up to here.
MAX_CALLS = 400
_SHELL_ERROR = re.compile(r"/slurm_script: line \d+: (.*)$")
_ERROR_LINE = re.compile(r"^(srun|slurmstepd[^:]*): (?:error: )?(.*)$")


@dataclass
class Call:
    """One recorded program call."""

    step: str
    procid: str
    localid: str
    node: str
    prog: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    when: int


@dataclass
class JobRun:
    job_id: str = ""
    exit_code: str = ""
    state: str = ""
    calls: list[Call] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    containers: list[list[str]] = field(default_factory=list)  # requests (containers.sh)
    submit_error: str = ""
    truncated: int = 0


def testbed_env() -> Optional[dict[str, str]]:
    """The environment that talks to the local testbed, or None when none runs."""
    from slurmfabric.testbed import Testbed, default_state_dir

    testbed = Testbed.from_state(default_state_dir())
    try:
        return testbed.env() if testbed.running() else None
    except Exception:  # a half-written state directory: no testbed to use
        return None


def cluster_shape(env: dict[str, str]) -> tuple[int, str]:
    """Idle or usable node count and the default partition, from sinfo."""
    out = subprocess.run(["sinfo", "-h", "-o", "%D %P"], env=env, capture_output=True,
                         text=True, timeout=30, check=False).stdout.split()
    nodes, partition = 1, ""
    for count, name in zip(out[::2], out[1::2]):
        if name.endswith("*"):
            nodes, partition = int(count), name.rstrip("*")
    return nodes, partition


# --- neutralising the request ---------------------------------------------------------

def _header_end(lines: list[str]) -> int:
    """sbatch reads #SBATCH lines until the first line that is neither comment nor blank."""
    for i, line in enumerate(lines):
        text = line.strip()
        if i == 0 and text.startswith("#!"):
            continue
        if text and not text.startswith("#"):
            return i
    return len(lines)


def _long_name(word: str, names: tuple[str, ...]) -> Optional[str]:
    """The option of ``names`` a --word means: exact, or an unambiguous abbreviation
    (sbatch takes getopt_long abbreviations)."""
    if word in names:
        return word
    found = [n for n in names if n.startswith(word)]
    return found[0] if len(found) == 1 and len(word) >= 3 else None


def _cap(value: str, nodes: int) -> str:
    parts = value.split("-")
    if all(p.isdigit() for p in parts):
        return "-".join(str(min(int(p), nodes)) for p in parts)
    return value


def neutralise(text: str, nodes: int) -> str:
    """``text`` with the #SBATCH options the testbed cannot grant removed (see module doc),
    node counts capped at ``nodes`` and an array cut to its first index."""
    lines = text.split("\n")
    end = _header_end(lines)
    for i in range(end):
        match = re.match(r"(\s*#SBATCH\s+)(.*)$", lines[i])
        if not match:
            continue
        body = match.group(2).split(" #", 1)[0]
        try:
            words = shlex.split(body)
        except ValueError:
            continue
        kept: list[str] = []
        j = 0
        while j < len(words):
            word = words[j]
            j += 1
            if word.startswith("--"):
                name, eq, value = word[2:].partition("=")
                drop = _long_name(name, _DROP_LONG)
                if drop and name not in _DROP_FLAGS:
                    if not eq:
                        j += 1  # its value is the next word
                    continue
                if _long_name(name, _DROP_FLAGS) and not _long_name(name, _DROP_LONG):
                    continue
                if _long_name(name, _NODES):
                    if not eq and j < len(words):
                        value, j = words[j], j + 1
                    kept.append(f"--nodes={_cap(value, nodes)}")
                    continue
                if _long_name(name, ("array",)):
                    if not eq and j < len(words):
                        value, j = words[j], j + 1
                    first = re.match(r"\d+", value)
                    kept.append(f"--array={first.group(0) if first else value}")
                    continue
                kept.append(word)
            elif word.startswith("-") and len(word) >= 2 and word[1] in _DROP_SHORT:
                if len(word) == 2:
                    j += 1
            elif word.startswith("-N"):
                value = word[2:]
                if not value and j < len(words):
                    value, j = words[j], j + 1
                kept.append(f"--nodes={_cap(value, nodes)}")
            elif word.startswith("-a"):
                value = word[2:] or (words[j] if j < len(words) else "")
                j += 0 if word[2:] else 1
                first = re.match(r"\d+", value)
                kept.append(f"--array={first.group(0) if first else value}")
            else:
                kept.append(word)
        lines[i] = (match.group(1) + " ".join(shlex.quote(w) for w in kept)) if kept \
            else "#"
    return "\n".join(lines)


# --- running one job ------------------------------------------------------------------

def _install(root: Path, relative: list[str]) -> tuple[Path, Path]:
    """The stand-in directory and the tools directory (SAFE_TOOLS, Slurm's clients and
    slurmfabric itself); ``relative`` programs get a stand-in at that path later."""
    bindir, tools = root / "bin", root / "tools"
    bindir.mkdir(parents=True, exist_ok=True)
    tools.mkdir(parents=True, exist_ok=True)
    standin = root / "standin"
    standin.write_text(_STANDIN.replace("@ROOT@", shlex.quote(str(root))), encoding="utf-8")
    standin.chmod(0o755)
    shutil.copy(Path(__file__).with_name("containers.sh"), root / "containers.sh")
    for name in PROGRAMS:
        (bindir / name).symlink_to(standin)
    # The slurmfabric of this interpreter (its venv), which the nodes share on the testbed.
    own = Path(sys.executable).parent / "slurmfabric"
    found = {"slurmfabric": str(own) if own.exists() else shutil.which("slurmfabric") or ""}
    for name in (*SAFE_TOOLS, *_SLURM_TOOLS, "hostname", "env", "mktemp", "timeout",
                 "xargs", "nproc", "stat", "test", "[", "getent"):
        if name not in PROGRAMS:
            found[name] = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin") or ""
    for name, target in found.items():
        if name == "srun" and target:  # srun without the container request (containers.sh)
            (tools / name).write_text(
                f"#!/bin/bash\n. {shlex.quote(str(root))}/containers.sh && sf_srun "
                f'{shlex.quote(target)} {shlex.quote(str(bindir))} "$@"\n', encoding="utf-8")
            (tools / name).chmod(0o755)
        elif target:
            (tools / name).symlink_to(target)
    (root / "prelude.sh").write_text(_PRELUDE, encoding="utf-8")
    return bindir, tools


def _submit(script: str, workdir: Path, recdir: Path, root: Path, env: dict[str, str],
            partition: str, limit_min: int, relative: list[str]) -> JobRun:
    workdir.mkdir(parents=True)
    recdir.mkdir(parents=True)
    for rel in relative:
        target = workdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / "standin", target)
    job_env = {
        **{k: v for k, v in env.items() if k in ("SLURM_CONF", "SLURMFABRIC_ALLOW_LOOPBACK",
                                                 "PYTHONPYCACHEPREFIX",
                                                 "SLURMFABRIC_PLAN_CACHE")},
        "PATH": f"{root / 'bin'}:{root / 'tools'}", "HOME": str(workdir), "LANG": "C.UTF-8",
        "BASH_ENV": str(root / "prelude.sh"), "SF_REC_DIR": str(recdir),
        "SF_STANDIN": str(root / "standin"), "USER": env.get("USER", "root"),
        # Open MPI as root on the testbed (docs/testbed.md), TCP between virtual nodes.
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_btl": "self,tcp",
    }
    path = workdir.parent / "job.sh"
    path.write_text(script, encoding="utf-8")
    run = JobRun()
    args = ["sbatch", "--parsable", f"--partition={partition}", f"--time={limit_min}",
            f"--chdir={workdir}", f"--output={workdir.parent / 'job.out'}", str(path)]
    sbatch_path = shutil.which("sbatch", path=env.get("PATH")) or "sbatch"
    done = subprocess.run([sbatch_path, *args[1:]], env=job_env, capture_output=True,
                          text=True, timeout=60, check=False)
    if done.returncode != 0:
        run.submit_error = " ".join(done.stderr.split())[:300]
        return run
    run.job_id = done.stdout.strip().split(";")[0]
    return run


def _state(job_id: str, env: dict[str, str]) -> tuple[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env,
                         capture_output=True, text=True, timeout=30, check=False).stdout
    state = re.search(r"JobState=(\S+)", out)
    code = re.search(r"\bExitCode=(\S+)", out)
    reason = re.search(r"\bReason=(\S+)", out)
    name = state.group(1) if state else "UNKNOWN"
    if name == "PENDING" and reason and reason.group(1) in _NEVER:
        name = f"PENDING ({reason.group(1)})"
    return name, (code.group(1) if code else "")


_ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY",
          "BOOT_FAIL", "DEADLINE", "PREEMPTED")
# Pending reasons that waiting does not cure on the testbed, whose nodes and partitions do
# not change (squeue(1), JOB REASON CODES): the job asks more than the partition has.
_NEVER = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints")


def wait(runs: list[JobRun], env: dict[str, str], timeout: float) -> None:
    """Wait until every submitted job ended (or cancel it at ``timeout``)."""
    deadline = time.monotonic() + timeout
    pending = [r for r in runs if r.job_id]
    while pending:
        for run in list(pending):
            run.state, run.exit_code = _state(run.job_id, env)
            if run.state.startswith("PENDING ("):  # never starts here: not waited for
                subprocess.run(["scancel", run.job_id], env=env, capture_output=True,
                               timeout=30, check=False)
            if run.state in _ENDED or run.state == "UNKNOWN" or run.state.startswith("PENDING ("):
                pending.remove(run)
        if pending and time.monotonic() > deadline:
            for run in pending:
                subprocess.run(["scancel", run.job_id], env=env, capture_output=True,
                               timeout=30, check=False)
                run.state = "CANCELLED (check timeout)"
            break
        if pending:
            time.sleep(0.5)


def collect(run: JobRun, workdir: Path, recdir: Path) -> None:
    """Read the stand-ins' records and srun's errors of a finished job."""
    for entry in sorted(recdir.iterdir()) if recdir.exists() else []:
        when, step, procid, _pid = (entry.name.split(".") + ["", "", "", ""])[:4]
        try:
            argv = (entry / "argv").read_bytes().decode("utf-8", "replace").split("\0")[:-1]
            env = dict(item.partition("=")[::2] for item in
                       (entry / "env").read_bytes().decode("utf-8", "replace").split("\0")
                       if "=" in item)
            run.calls.append(Call(step, procid, (entry / "localid").read_text(),
                                  (entry / "node").read_text(), (entry / "prog").read_text(),
                                  argv, (entry / "cwd").read_text(), env,
                                  int(when) if when.isdigit() else 0))
        except OSError:
            continue  # a record cut short by the job's end
    requests = Path(f"{recdir}.container")
    for entry in sorted(requests.iterdir()) if requests.exists() else []:
        run.containers.append(entry.read_bytes().decode("utf-8", "replace").split("\0")[:-1])
    run.calls.sort(key=lambda c: c.when)
    if len(run.calls) > MAX_CALLS:
        run.truncated = len(run.calls)
        del run.calls[MAX_CALLS:]
    out = workdir.parent / "job.out"
    text = out.read_text(encoding="utf-8", errors="replace") if out.exists() else ""
    for line in text.splitlines():
        match = _ERROR_LINE.match(line.strip())
        if match and "CANCELLED AT" not in line:
            run.errors.append(match.group(2))
        shell = _SHELL_ERROR.search(line)
        if shell:  # the batch shell's own error (set -u, a missing file), without its line
            run.errors.append(f"batch shell: {shell.group(1)}")


# --- comparing ------------------------------------------------------------------------

class _Norm:
    """Replaces what differs between two runs of the same job by nature: node names, the
    job's own directory, mktemp names. The job id is matched at comparison (``_eq``)."""

    def __init__(self, run: JobRun, workdir: Path, nodes: list[str]) -> None:
        self.subs = [(str(workdir), "<workdir>"), (str(workdir.parent), "<jobdir>")]
        self.job_id = run.job_id
        self.nodes = sorted(set(nodes), key=len, reverse=True)

    def __call__(self, value: str) -> str:
        for old, new in self.subs:
            value = value.replace(old, new)
        value = re.sub(r"/tmp/tmp\.[A-Za-z0-9]{10}", "/tmp/<mktemp>", value)
        for node in self.nodes:
            value = re.sub(rf"\b{re.escape(node)}\b", "<node>", value)
        return value

    def job(self, value: str) -> str:
        return re.sub(rf"(?<![0-9]){self.job_id}(?![0-9])", "<jobid>", value) \
            if self.job_id else value


_NORMS: list[_Norm] = []


def _eq(x: Any, y: Any) -> bool:
    """Equal, or equal once each run's own job id is a placeholder."""
    if x == y or not _NORMS or x is None or y is None:
        return x == y
    a, b = _NORMS
    if isinstance(x, str) and isinstance(y, str):
        return a.job(x) == b.job(y)
    return len(x) == len(y) and all(a.job(u) == b.job(v) for u, v in zip(x, y))


def _program(call: Call, norm: _Norm) -> list[str]:
    name = Path(call.prog).name if call.prog else ""
    argv = [norm(a) for a in call.argv]
    if name in ("standin", "") and argv:  # through command_not_found_handle: argv[0] is it
        return argv
    if name == "torchrun" or (name.startswith("python") and argv[:2] in (
            ["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"])):
        start = 0 if name == "torchrun" else 2
        return [name if name == "torchrun" else "torchrun", *_torchrun_args(argv[start:])]
    return [name, *argv]


def _torchrun_args(argv: list[str]) -> list[str]:
    """torchrun's options as --name=value (``_`` spelt ``-``), without what slurmfabric
    derives, then the worker's command line as torchrun starts it: ``python -u SCRIPT``
    (``-m`` for a module), or the command itself with ``--no-python`` (without a
    ``slurmfabric launch ... --`` wrapper in front)."""
    out: list[str] = []
    flags: set[str] = set()
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, value = argv[i].lstrip("-").partition("=")
        name = name.replace("_", "-")
        i += 1
        if name in _TORCHRUN_FLAGS:
            flags.add("module" if name == "m" else name)
            continue
        if not eq and i < len(argv):
            value, i = argv[i], i + 1
        if name not in _TORCHRUN_DERIVED:
            out.append(f"--{name}={value}")
    rest = argv[i:]
    if "no-python" in flags:
        # slurmfabric's own launch, or its zipapp's in a container image
        if (rest[:2] == ["slurmfabric", "launch"] or rest[:3] == [*rest[:1], CONTAINER_PATH,
                                                                   "launch"]) and "--" in rest:
            rest = rest[rest.index("--") + 1:]
    else:
        rest = ["python", "-u", *(["-m"] if "module" in flags else []), *rest]
    return [*sorted(out), *rest]


def _env(call: Call, norm: _Norm, original: dict[str, str],
         params: frozenset[str]) -> dict[str, str]:
    """The environment compared: not what _SKIP names, not the config's parameters (the
    rendered script exports them where the original kept shell variables)."""
    return {k: norm(v) for k, v in call.env.items()
            if k not in _SKIP and not k.startswith(_SKIP_PREFIX) and k not in params
            and not (k in _ADDED_DEFAULTS and k not in original)}


@dataclass
class _Step:
    where: str
    nodes: int
    per_node: list[int]
    tasks: list[tuple[list[str], str]]
    env: dict[str, str]
    seen: Counter = field(default_factory=Counter)


def _steps(run: JobRun, norm: _Norm, original_env: dict[str, str],
           params: frozenset[str]) -> list[_Step]:
    """The job as steps in order: each batch-shell command is its own entry; a Slurm step
    is one entry with its node and task counts and each task's program and directory."""
    out: list[_Step] = []
    seen: dict[str, _Step] = {}
    for call in run.calls:
        program = _program(call, norm)
        env = _env(call, norm, original_env, params)
        if call.step == "batch":
            out.append(_Step("batch shell", 1, [1], [(program, norm(call.cwd))], env))
            continue
        step = seen.get(call.step)
        if step is None:
            step = seen[call.step] = _Step("step", 0, [], [], env)
            out.append(step)
        step.seen[call.node] += 1
        step.tasks.append((program, norm(call.cwd)))
        step.env = {k: v for k, v in step.env.items() if env.get(k) == v}  # common to all
    for step in out:
        if step.where == "step":
            step.nodes, step.per_node = len(step.seen), sorted(step.seen.values(), reverse=True)
            step.tasks.sort(key=lambda t: (t[0], t[1]))
    return out


def _label(step: _Step, index: int) -> str:
    first = " ".join(step.tasks[0][0])[:80] if step.tasks else ""
    return f"{step.where} #{index + 1} ({first})"


def compare(orig: JobRun, new: JobRun, norms: tuple[_Norm, _Norm], report: CheckReport,
            params: frozenset[str] = frozenset()) -> None:
    """Every difference between the two runs, one line each, naming the step."""
    base_env: dict[str, str] = {}
    for call in orig.calls:
        base_env.update(call.env)
    _NORMS[:] = list(norms)
    a, b = _steps(orig, norms[0], base_env, params), _steps(new, norms[1], base_env, params)
    diff = report.differences
    keys_a, keys_b = [_key(s) for s in a], [_key(s) for s in b]
    matcher = difflib.SequenceMatcher(a=keys_a, b=keys_b, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                _compare_step(a[i], b[j], _label(a[i], i), diff)
            continue
        # Steps launching the same program are the same step with other details.
        left, right = list(range(i1, i2)), list(range(j1, j2))
        for i in list(left):
            match = next((j for j in right if a[i].where == b[j].where == "step"
                          and _key(a[i])[1][:1] == _key(b[j])[1][:1]), None)
            if match is not None:
                _compare_step(a[i], b[match], _label(a[i], i), diff)
                left.remove(i)
                right.remove(match)
        diff.extend(f"{_label(a[i], i)}: runs in the original only" for i in left)
        diff.extend(f"rendered {_label(b[j], j)}: runs in the rendered script only"
                    for j in right)
    for run, name in ((orig, "original"), (new, "rendered script")):
        if run.truncated:
            report.added.append(f"the {name} ran {run.truncated} recorded commands (a loop "
                                f"waiting on what a stand-in does not do?); compared up to "
                                f"{MAX_CALLS}")
    _compare_containers(orig, new, norms, report)
    if not _eq([norms[0](e) for e in orig.errors], [norms[1](e) for e in new.errors]):
        diff.append(f"errors printed: {orig.errors} becomes {new.errors}")
    if (orig.exit_code, orig.state) != (new.exit_code, new.state):
        diff.append(f"job exit: {orig.state} {orig.exit_code} becomes "
                    f"{new.state} {new.exit_code}")


# Options naming bind mounts, compared entry by entry (short forms as the long ones).
_MOUNTS = {"--container-mounts": "--container-mounts", "--bind": "--bind", "-B": "--bind",
           "--volume": "--volume", "-V": "--volume", "--mount": "--mount", "-m": "--mount"}


def _container(request: list[str], norm: _Norm) -> tuple[tuple[str, ...], list[str]]:
    """A container request (containers.sh) as compared, and what slurmfabric's own script
    adds to it: its zipapp's bind mount, ``--container-env``, the job-scoped
    ``--container-name=sf-JOBID``, apptainer's ``--nv`` for a GPU job."""
    runtime, options = (request[0], request[1:]) if request else ("", [])
    image = []
    if runtime in ("apptainer", "singularity", "enroot") and options \
            and not options[-1].startswith("-"):
        image, options = [norm(options[-1])], options[:-1]
    words, own = [], []
    for word in options:
        name, eq, value = norm(word).partition("=")
        if name in _MOUNTS and eq:
            for entry in value.split(","):
                (own if CONTAINER_PATH in entry else words).append(f"{_MOUNTS[name]}={entry}")
        elif name in ("--container-env", "--nv") or (name == "--container-name"
                                                     and norm.job(value) == "sf-<jobid>"):
            own.append(f"{name}{eq}{value}")
        else:
            words.append(f"{name}{eq}{value}")
    return (runtime, *sorted(words), *image), own


def _compare_containers(orig: JobRun, new: JobRun, norms: tuple[_Norm, _Norm],
                        report: CheckReport) -> None:
    """The container requests of both jobs (neutralised before they ran), as text."""
    seen: list[dict[tuple[str, ...], None]] = [{}, {}]
    added: dict[str, None] = {}
    for side, (run, norm) in enumerate(((orig, norms[0]), (new, norms[1]))):
        for request in run.containers:
            key, own = _container(request, norm)
            seen[side][key] = None
            if side:
                added.update(dict.fromkeys(own))
    left = [k for k in seen[0] if k not in seen[1]]
    right = [k for k in seen[1] if k not in seen[0]]
    for a, b in zip(left, right):
        report.differences.append(f"container request: {' '.join(a)} becomes {' '.join(b)}")
    report.differences.extend(f"container request: {' '.join(a)} is not made by the "
                              f"rendered script" for a in left[len(right):])
    report.differences.extend(f"container request: {' '.join(b)} is made by the rendered "
                              f"script only" for b in right[len(left):])
    if added:
        report.added.append("container request: slurmfabric adds " + " ".join(added))


def _key(step: _Step) -> tuple[str, tuple[str, ...]]:
    """What lines two runs' entries up: a batch-shell command by its whole argv, a step by
    the program its first task runs."""
    program = tuple(step.tasks[0][0]) if step.tasks else ()
    return step.where, program if step.where == "batch shell" else program[:1]


def _compare_step(x: _Step, y: _Step, label: str, diff: list[str]) -> None:
    if (x.nodes, x.per_node) != (y.nodes, y.per_node):
        diff.append(f"{label}: {x.nodes} node(s), tasks per node {x.per_node} becomes "
                    f"{y.nodes} node(s), tasks per node {y.per_node}")
    xs, ys = [t[0] for t in x.tasks], [t[0] for t in y.tasks]
    if not _eq([" ".join(t) for t in sorted(xs)], [" ".join(t) for t in sorted(ys)]):
        first_x = next((t for t in xs if t not in ys), xs[0] if xs else [])
        first_y = next((t for t in ys if t not in xs), ys[0] if ys else [])
        diff.append(f"{label}: argv {first_x} becomes {first_y}")
    xd, yd = sorted({t[1] for t in x.tasks}), sorted({t[1] for t in y.tasks})
    if not _eq(xd, yd):
        diff.append(f"{label}: working directory {xd} becomes {yd}")
    for name in sorted(set(x.env) | set(y.env)):
        if not _eq(x.env.get(name), y.env.get(name)):
            diff.append(f"{label}: env {name}: {x.env.get(name)!r} becomes "
                        f"{y.env.get(name)!r}")


# --- the whole check ------------------------------------------------------------------

@dataclass
class Pending:
    """A submitted pair, so that several checks can run at once (the corpus tests)."""

    report: CheckReport
    root: Path
    runs: tuple[JobRun, JobRun]
    keep: bool
    params: frozenset[str] = frozenset()


def start(original: str, rendered: str, env: dict[str, str], *, relative: list[str],
          root: Optional[Path] = None, limit_min: int = 1,
          params: frozenset[str] = frozenset()) -> Pending:
    """Compare the requests, neutralise both scripts and submit them; ``finish`` waits."""
    report = CheckReport()
    compare_request(original, rendered, report)
    nodes, partition = cluster_shape(env)
    keep = root is not None
    root = root or Path(tempfile.mkdtemp(prefix="sf-import-check-"))
    _install(root, relative)
    runs = []
    for name, text in (("original", original), ("rendered", rendered)):
        runs.append(_submit(neutralise(text, nodes), root / name / "work", root / name / "rec",
                            root, env, partition, limit_min, relative))
    return Pending(report, root, (runs[0], runs[1]), keep, params)


def finish(pending: Pending, env: dict[str, str], timeout: float = 240) -> CheckReport:
    report, (orig, new) = pending.report, pending.runs
    for run, name in ((orig, "original"), (new, "rendered")):
        if run.submit_error:
            report.differences.append(f"submit: sbatch refused the {name} script: "
                                      f"{run.submit_error}")
    if orig.submit_error or new.submit_error:
        _cleanup(pending)
        return report
    wait([orig, new], env, timeout)
    norms = []
    for run, name in ((orig, "original"), (new, "rendered")):
        collect(run, pending.root / name / "work", pending.root / name / "rec")
        nodes = [c.node for c in run.calls if c.node]
        norms.append(_Norm(run, pending.root / name / "work", nodes))
    report.original_exit = _code(orig.exit_code)
    report.rendered_exit = _code(new.exit_code)
    compare(orig, new, (norms[0], norms[1]), report, pending.params)
    _cleanup(pending)
    return report


def _code(exit_code: str) -> int:
    head = exit_code.split(":")[0]
    return int(head) if head.isdigit() else -1


def _cleanup(pending: Pending) -> None:
    if not pending.keep:
        shutil.rmtree(pending.root, ignore_errors=True)


def check(original: str, config: Any, env: dict[str, str], *,
          root: Optional[Path] = None, timeout: float = 240) -> CheckReport:
    """Compare ``original`` with the script ``config`` renders, both run on the testbed."""
    return finish(submit(original, config, env, root=root), env, timeout)


def submit(original: str, config: Any, env: dict[str, str], *,
           root: Optional[Path] = None) -> Pending:
    """Render ``config`` and submit both scripts; ``finish`` waits and compares."""
    from slurmfabric.job.importer.check import _relative_programs
    from slurmfabric.job.render import render_sbatch

    rendered = render_sbatch(config)
    relative = sorted(set(_relative_programs(config)) | set(relative_programs(original)))
    params = frozenset(getattr(config.program, "params", None) or ())
    return start(original, rendered, env, relative=relative, root=root, params=params)


_RELATIVE = re.compile(r"(?<![\w/$}])((?:\./)?[\w.-]+(?:/[\w.-]+)*/bin/(?:python[0-9.]*|"
                       r"torchrun|accelerate|deepspeed))\b")


def relative_programs(text: str) -> list[str]:
    """Launchers a script names by a relative path (``./venv/bin/torchrun``): each gets a
    stand-in at that path in the job's directory."""
    return sorted({m.group(1) for m in _RELATIVE.finditer(text)
                   if not m.group(1).startswith("/")})

