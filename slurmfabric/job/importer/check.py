"""``slurmfabric import --check``: does the rendered config do what the original script did?

Three comparisons. The request: both scripts' ``#SBATCH`` options (read as sbatch reads them,
sbatch.py). The behaviour: both scripts run with bash among recording stand-ins (job/importstubs.py)
in a fake allocation of the requested node count, in the same empty directory; what was
recorded is compared: the main launch's program argv and environment, the launchers above
it with their options, and the commands the batch shell itself ran (setup and teardown).
Values slurmfabric derives (rank variables, MASTER_ADDR, the rendezvous, SLURMFABRIC_*) are
not compared. Nothing here reaches a real cluster: ``PATH`` holds only the stand-ins and a
few tools that write no file (SAFE_TOOLS); every other program is recorded, not run. The
scripts' own shell code does run (builtins, redirections), in an empty temporary directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from slurmfabric.job.importer import sbatch
from slurmfabric.job.render import flight_recorder_names

_NOT_COMPARED_ENV = ("SLURM", "SLURMFABRIC_", "OMPI_", "TORCHELASTIC_", "BASH", "SHLVL", "_",
                     "PWD", "OLDPWD")
_DERIVED = frozenset({"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                      "NODE_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "RDZV_ID",
                      "sf_bin", "sf_check", "slurmfabric_job_env", "mpirun_bin"})
# Diagnostics slurmfabric adds by default (launcher.nccl_flight_recorder, job/render.py):
# compared only where the original set them too.
_ADDED_DEFAULTS = flight_recorder_names()
# srun options slurmfabric sets itself on its launch step (counts, error handling).
_SRUN_OWN = ("--nodes", "--ntasks", "--ntasks-per-node", "--kill-on-bad-exit", "--jobid",
             "--cpus-per-task", "-N", "-n", "-c", "--export=ALL")
_TORCHRUN_OWN = frozenset({"rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
                           "node-rank", "master-addr", "master-port", "standalone"})
_SBATCH_DEFAULTS = {("chdir", "."), ("export", "ALL")}


@dataclass
class CheckReport:
    differences: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # what slurmfabric adds (informational)
    original_exit: int = 0
    rendered_exit: int = 0

    @property
    def same(self) -> bool:
        return not self.differences


def request(text: str) -> dict[str, str]:
    """``#SBATCH`` options as sbatch reads them; ``--ntasks`` as tasks per node."""
    found, _bad = sbatch.directives(text)
    out = {d.name: d.value or "" for d in found if (d.name, d.value) not in _SBATCH_DEFAULTS}
    if out.get("ntasks", "").isdigit() and "ntasks-per-node" not in out:
        nodes = int(out.get("nodes", "1")) if out.get("nodes", "1").isdigit() else 1
        if int(out["ntasks"]) % nodes == 0:
            out["ntasks-per-node"] = str(int(out.pop("ntasks")) // nodes)
    return out


def compare_request(original: str, rendered: str, report: CheckReport) -> None:
    old, new = request(original), request(rendered)

    def opt(name: str, value: str) -> str:
        return f"--{name}={value}" if value else f"--{name}"

    for name in sorted(old):
        if name not in new:
            report.differences.append(f"request: {opt(name, old[name])} is not requested")
        elif old[name] != new[name]:
            report.differences.append(f"request: {opt(name, old[name])} becomes "
                                      f"{opt(name, new[name])}")
    for name in sorted(set(new) - set(old)):
        report.added.append(f"request: slurmfabric adds {opt(name, new[name])}")


def _allocation(nodes: int, tasks_per_node: int, gpus: int, workdir: Path) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_JOB_NAME": "import-check",
        "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": f"node[1-{nodes}]" if nodes > 1 else "node1",
        "SLURM_NODELIST": f"node[1-{nodes}]" if nodes > 1 else "node1",
        "SLURM_NODEID": "0", "SLURMD_NODENAME": "node1", "SLURM_SUBMIT_DIR": str(workdir),
        "SLURM_NTASKS": str(nodes * tasks_per_node), "SLURM_NPROCS": str(nodes * tasks_per_node),
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})", "SLURM_CPUS_ON_NODE": "8",
        # A node's own library path (set by its modules or profile), which prepends keep.
        "LD_LIBRARY_PATH": "/opt/site/lib",
    }
    if gpus:
        env["SLURM_GPUS_PER_NODE"] = str(gpus)
    return env


# Programs a script may run for real during a check: they read, print or compute and write
# no file. Anything else (rm, cp, curl, sbatch, a real python...) is recorded, never run.
SAFE_TOOLS = ("awk", "basename", "bash", "cat", "cut", "date", "dirname", "echo", "env",
              "expr", "false", "grep", "head", "id", "ls", "printf", "pwd", "readlink",
              "realpath", "sed", "seq", "sh", "sort", "tail", "tr", "true", "uname", "uniq",
              "wc", "whoami")
STAND_INS = ("srun", "mpirun", "mpiexec", "torchrun", "python", "python3", "scontrol",
             "hostname", "module", "slurmfabric", "tee", "sleep", "stub")


def _install_stubs(bindir: Path, tools: Path) -> None:
    bindir.mkdir(parents=True)
    tools.mkdir(parents=True)
    # -I: no user site or PYTHON* variables; -B: no bytecode written next to the package.
    package_root = Path(__file__).resolve().parents[3]
    body = (f"#!{sys.executable} -IB\nimport sys\nsys.path.insert(0, {str(package_root)!r})\n"
            "from slurmfabric.job.importstubs import main\nmain()\n")
    for name in STAND_INS:
        path = bindir / name
        path.write_text(body, encoding="utf-8")
        path.chmod(0o755)
    for name in SAFE_TOOLS:
        found = shutil.which(name, path="/usr/bin:/bin")
        if found:
            (tools / name).symlink_to(found)


def run_recorded(script: str, env: dict[str, str], workdir: Path, stubs: Path,
                 relative: list[str], timeout: float = 60) -> tuple[int, list[dict[str, Any]]]:
    """Run ``script`` with bash among the stand-ins; its exit code and the recorded calls."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    for rel in relative:  # ./venv/bin/torchrun and the like: stand-ins at that path
        target = workdir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(stubs / "stub", target)
    records = workdir.parent / "records"
    if records.exists():
        shutil.rmtree(records)
    records.mkdir()
    prelude = workdir.parent / "prelude.sh"
    prelude.write_text(f'command_not_found_handle() {{ {stubs / "stub"} __leaf__ "$@"; }}\n',
                       encoding="utf-8")
    script_path = workdir.parent / "script.sh"
    script_path.write_text(script, encoding="utf-8")
    full = {"PATH": f"{stubs}:{stubs.parent / 'tools'}", "HOME": str(workdir), "LANG": "C.UTF-8",
            "BASH_ENV": str(prelude), "SF_STUB_DIR": str(records), "SF_STUB_BIN": str(stubs),
            "SF_STUB_CHAIN": "[]", **env}
    bash = str(stubs.parent / "tools" / "bash")
    done = subprocess.run([bash, str(script_path)], cwd=workdir, env=full, timeout=timeout,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    calls_file = records / "calls.jsonl"
    calls = [json.loads(line) for line in calls_file.read_text(encoding="utf-8").splitlines()] \
        if calls_file.exists() else []
    return done.returncode, calls


def _main_launch(calls: list[dict[str, Any]]) -> Optional[int]:
    """The last program a launcher started (the launch; earlier ones are probes or steps)."""
    found = None
    for i, call in enumerate(calls):
        if call["kind"] == "leaf" and set(call["chain"]) & {"srun", "mpirun", "torchrun"}:
            found = i
    return found


def _launchers(calls: list[dict[str, Any]], upto: int) -> list[dict[str, Any]]:
    """The launchers above the launch: for each kind in its chain, the nearest record of
    that kind before it (an earlier probe or node check is another chain)."""
    out = []
    for kind in calls[upto]["chain"]:
        if kind not in ("srun", "mpirun", "torchrun"):
            continue
        for call in reversed(calls[:upto]):
            if call["kind"] == "launcher" and call.get("launcher") == kind:
                out.append(call)
                break
    return out


def _batch_commands(calls: list[dict[str, Any]], launch: Optional[int]) -> list[str]:
    """Commands the batch shell ran itself, each marked before/after the launch."""
    out = []
    for i, call in enumerate(calls):
        if call["chain"] or call["kind"] != "leaf":
            continue
        when = "before" if launch is None or i < launch else "after"
        out.append(f"{when}: {' '.join(call['argv'])}")
    return out


def _env(call: dict[str, Any], base: dict[str, str], skip: frozenset[str]) -> dict[str, str]:
    return {k: v for k, v in call["env"].items() if k not in _DERIVED and k not in skip
            and not k.startswith(_NOT_COMPARED_ENV) and base.get(k) != v}


def _srun_options(call: dict[str, Any]) -> list[str]:
    kept = (_without_own_container(o) for o in call.get("options", [])
            if not o.startswith(_SRUN_OWN) and o not in ("-K", "-K1")
            and not _own_container_option(o))
    return sorted(o for o in kept if o != "--container-mounts=")


def _own_container_option(option: str) -> bool:
    """pyxis options a rendered container job adds (job/render.py ``container``): the
    job-scoped name and the plan's --container-env."""
    return (option.startswith("--container-name=sf-") or
            (option.startswith("--container-env=") and "SLURMFABRIC_CONTAINER_ENV" in option))


def _without_own_container(option: str) -> str:
    """--container-mounts without the slurmfabric zipapp's mount."""
    if not option.startswith("--container-mounts="):
        return option
    from slurmfabric.job.zipapp import CONTAINER_PATH

    mounts = [m for m in option.split("=", 1)[1].split(",")
              if not m.endswith(f":{CONTAINER_PATH}:ro")]
    return "--container-mounts=" + ",".join(mounts)


def _torchrun_options(call: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in call.get("options", {}).items() if k not in _TORCHRUN_OWN}


def _mpirun_options(call: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """mpirun options as meaning: ranks (-np), ranks per node, the rest as written."""
    opts = call.get("options", [])
    out: dict[str, str] = {}
    i = 0
    while i < len(opts):
        name = opts[i].lstrip("-")
        value = opts[i + 1] if i + 1 < len(opts) and not opts[i + 1].startswith("-") else ""
        if name in ("np", "n", "c"):
            out["ranks"] = value
        elif name in ("N", "npernode"):
            out["ranks per node"] = value
        elif name == "map-by" and value.startswith("ppr:") and value.endswith(":node"):
            out["ranks per node"] = value.split(":")[1]
        elif name in ("mca", "gmca"):
            out[f"--{name} {opts[i + 1]}"] = opts[i + 2] if i + 2 < len(opts) else ""
            i += 3
            continue
        elif name == "bind-to" and value == "none":
            pass  # slurmfabric adds it unless the user binds: the same either way
        else:
            out[f"--{name}"] = value
        i += 2 if value else 1
    # Without them Open MPI under Slurm fills each node's slots: the allocation's tasks.
    out.setdefault("ranks", env.get("SLURM_NTASKS", ""))
    out.setdefault("ranks per node", env.get("SLURM_TASKS_PER_NODE", "").split("(")[0])
    return out


def compare_runs(orig: list[dict[str, Any]], new: list[dict[str, Any]], base: dict[str, str],
                 report: CheckReport, params: frozenset[str] = frozenset()) -> None:
    """``params``: the config's parameters, which slurmfabric passes in the environment
    where a script kept them as shell variables; not compared as environment."""
    a, b = _main_launch(orig), _main_launch(new)
    if a is None or b is None:
        report.differences.append("launch: " + ("the original" if a is None else "the rendered")
                                  + " script started no program through a launcher")
        return
    old, cur = orig[a], new[b]
    if old["argv"] != cur["argv"]:
        report.differences.append(f"launch argv: {old['argv']} becomes {cur['argv']}")
    old_env, new_env = _env(old, base, params), _env(cur, base, params)
    for name in sorted(set(old_env) | set(new_env)):
        if name in _ADDED_DEFAULTS and name not in old_env:
            continue  # slurmfabric's flight-recorder default, where the original set none
        if old_env.get(name) != new_env.get(name):
            report.differences.append(f"launch env {name}: {old_env.get(name)!r} becomes "
                                      f"{new_env.get(name)!r}")
    old_l = {c["launcher"]: c for c in _launchers(orig, a)}
    new_l = {c["launcher"]: c for c in _launchers(new, b)}
    if list(old_l) != list(new_l):
        report.differences.append(f"launchers: {' > '.join(old_l)} becomes "
                                  f"{' > '.join(new_l)}")
    if "srun" in old_l and "srun" in new_l:
        x, y = _srun_options(old_l["srun"]), _srun_options(new_l["srun"])
        if x != y:
            report.differences.append(f"srun options: {x} becomes {y}")
    if "torchrun" in old_l and "torchrun" in new_l:
        x2, y2 = _torchrun_options(old_l["torchrun"]), _torchrun_options(new_l["torchrun"])
        for name in sorted(set(x2) | set(y2)):
            if x2.get(name) != y2.get(name):
                report.differences.append(f"torchrun --{name}: {x2.get(name)!r} becomes "
                                          f"{y2.get(name)!r}")
    if "mpirun" in old_l and "mpirun" in new_l:
        x3, y3 = _mpirun_options(old_l["mpirun"], base), _mpirun_options(new_l["mpirun"], base)
        for name in sorted(set(x3) | set(y3)):
            if x3.get(name) != y3.get(name):
                report.differences.append(f"mpirun {name}: {x3.get(name)!r} becomes "
                                          f"{y3.get(name)!r}")
    x4, y4 = _batch_commands(orig, a), _batch_commands(new, b)
    if x4 != y4:
        report.differences.append(f"batch-shell commands: {x4} becomes {y4}")


def check(original: str, config: Any, *, keep: Optional[Path] = None) -> CheckReport:
    """Compare ``original`` with the script ``config`` (a JobConfig) renders."""
    from slurmfabric.job.options import shape
    from slurmfabric.job.render import render_sbatch

    rendered = render_sbatch(config)
    report = CheckReport()
    compare_request(original, rendered, report)
    job_shape = shape(config)
    relative = [p for p in _relative_programs(config) if not p.startswith("/")]
    root = Path(tempfile.mkdtemp(prefix="sf-import-check-")) if keep is None else keep
    try:
        stubs = root / "bin"
        _install_stubs(stubs, root / "tools")
        work = root / "work"
        env = _allocation(job_shape.nodes, job_shape.tasks_per_node, job_shape.gpus_per_node,
                          work)
        report.original_exit, orig = run_recorded(original, env, work, stubs, relative)
        report.rendered_exit, new = run_recorded(rendered, env, work, stubs, relative)
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    base = {**env, "PATH": f"{stubs}:{root / 'tools'}", "HOME": str(work), "LANG": "C.UTF-8"}
    compare_runs(orig, new, base, report,
                 frozenset(getattr(config.program, "params", None) or ()))
    if report.original_exit != report.rendered_exit:
        report.differences.append(f"exit code: {report.original_exit} becomes "
                                  f"{report.rendered_exit}")
    return report


def _relative_programs(config: Any) -> list[str]:
    """Launchers given as paths (``./venv/bin/torchrun``): the rendered script execs them."""
    launcher = config.launcher
    words = [launcher.torchrun] if isinstance(launcher.torchrun, str) else list(launcher.torchrun)
    return [w for w in words[:1] + [launcher.mpirun] if "/" in w]

