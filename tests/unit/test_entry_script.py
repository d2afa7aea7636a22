"""The installed ``slurmfabric`` command is slurmfabric/__main__.py as a plain script: what
every rank's ``srun ... slurmfabric launch`` runs before slurmfabric's own code, so it must
not import what an installer's entry-point wrapper does (pip's imports ``re``), and
``launch``'s exec must not pull in ``warnings`` (os.execvpe does)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import fakesysfs
import nodes
import pytest
from cleanenv import clean_env

from slurmfabric.rank import task as taskenv

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "slurmfabric" / "__main__.py"
STEP = {"SLURM_JOB_ID": "41", "SLURM_CLUSTER_NAME": "c", "SLURM_JOB_NODELIST": "gpu[1-2]",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[1-2]",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "16",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_PROCID": "8", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1", "SLURMD_NODENAME": "gpu2", "SLURMFABRIC_ALLOW_LOOPBACK": "1"}
# What a rank's start must never import before the program runs: an installer wrapper's
# re / importlib.metadata, runpy's machinery (python -m), os.execvpe's warnings, and the
# cached path's non-needs (test_plancache.py checks the planner and discovery).
FORBIDDEN = {"re", "importlib", "importlib.metadata", "importlib.util", "runpy", "warnings",
             "json", "hashlib", "contextlib", "typing", "argparse", "shlex", "ctypes"}
# pip 23's entry-point wrapper for `slurmfabric = "slurmfabric.cli:main"` (the old install)
PIP_WRAPPER = """#!python
# -*- coding: utf-8 -*-
import re
import sys
from slurmfabric.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def installed(tmp_path: Path, text: str | None = None) -> Path:
    """The script where an installer puts it (a bin directory: sys.path[0] when it runs)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "slurmfabric"
    if text is None:
        shutil.copy(MAIN, script)
    else:
        script.write_text(text)
    return script


def imports(script: Path, args: list[str], env: dict[str, str]) -> tuple[set[str], str]:
    """Modules the script imports beyond a bare interpreter's (-X importtime), and stdout."""
    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-X", "importtime", *argv], env=env,
                              capture_output=True, text=True)

    def names(stderr: str) -> set[str]:
        return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
                if line.startswith("import time:") and "|" in line} - {"package"}

    proc = run([str(script), *args])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return names(proc.stderr) - names(run(["-c", "pass"]).stderr), proc.stdout


def test_pyproject_installs_the_plain_script_not_an_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "slurmfabric" not in project["project"].get("scripts", {})
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["shared-scripts"] == {"slurmfabric/__main__.py": "slurmfabric"}
    # shared-scripts: hatchling 1.23; their executable mode kept: 1.24.1 (its changelog)
    assert "hatchling>=1.24.1" in project["build-system"]["requires"]


def test_the_script_is_executable_and_an_installer_rewrites_its_shebang() -> None:
    first = MAIN.read_bytes().split(b"\n", 1)[0]
    # the wheel spec's rule for scripts ("#!python" is rewritten to the interpreter):
    # https://packaging.python.org/en/latest/specifications/binary-distribution-format/
    assert re.match(rb"^#!.*python[0-9.]*$", first), first
    assert MAIN.stat().st_mode & stat.S_IXUSR
    tree = ast.parse(MAIN.read_text())
    imported = [(type(node).__name__, getattr(node, "module", None),
                 [alias.name for alias in node.names])
                for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imported == [("ImportFrom", "slurmfabric.cli", ["run"])]


def test_the_installed_script_runs_the_cli(tmp_path: Path) -> None:
    env = clean_env(PYTHONPATH=os.pathsep.join(sys.path))
    script = installed(tmp_path)
    ran = subprocess.run([sys.executable, str(script), "--version"], env=env,
                         capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, "slurmfabric 0.1.0\n")
    bad = subprocess.run([sys.executable, str(script), "no-such-command"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command 'no-such-command'" in bad.stderr
    module = subprocess.run([sys.executable, "-m", "slurmfabric", "--version"], env=env,
                            capture_output=True, text=True, cwd=tmp_path)
    assert module.stdout == ran.stdout


def test_the_check_below_catches_an_entry_point_wrapper(tmp_path: Path) -> None:
    env = clean_env(PYTHONPATH=os.pathsep.join(sys.path))
    found, _ = imports(installed(tmp_path, PIP_WRAPPER), ["--version"], env)
    assert "re" in found


@pytest.mark.parametrize("fixture", ["h100_ib", "h100_roce_numa_off"])
def test_a_warm_rank_imports_nothing_forbidden(tmp_path: Path, fixture: str) -> None:
    root = fakesysfs.build(getattr(nodes, fixture)(), tmp_path / "root")
    env = clean_env(**STEP, SLURMFABRIC_SYSFS_ROOT=str(root),
                    SLURMFABRIC_PLAN_CACHE=str(tmp_path / "cache"),
                    PYTHONPATH=os.pathsep.join(sys.path))
    script = installed(tmp_path)
    assert imports(script, ["--version"], env)[0] & FORBIDDEN == set()
    shown = [imports(script, ["launch", "--print", "--", "true"], env)[1] for _ in range(2)]
    assert ["# plan: discovered" in shown[0], "# plan: cache" in shown[1]] == [True, True]
    assert "NCCL_IB_HCA" in shown[1]
    for args in (["launch", "--", "true"], ["env"], ["launch", "--mode", "srun", "--",
                                                     sys.executable, "-c", "pass"]):
        found, _ = imports(script, args, env)
        assert found & FORBIDDEN == set(), args
        assert not any(m.startswith(("slurmfabric.plan", "slurmfabric.topology"))
                       for m in found), args


# Every module a warm rank imports costs its import machinery (about 0.1 ms, 0.6 % of a bare
# interpreter's start on the benchmark machine) in every rank of every job, so the set is
# fixed here: adding one to the per-rank path is a decision (benchmarks/bench_startup.py).
WARM_RANK = {"__future__", "slurmfabric", "slurmfabric.errors", "slurmfabric.cli",
             "slurmfabric.commands", "slurmfabric.commands.env", "slurmfabric.rank",
             "slurmfabric.rank.task", "slurmfabric.rank.env", "slurmfabric.rank.plancache",
             "slurmfabric._common", "slurmfabric._common.record", "slurmfabric.slurm",
             "slurmfabric.slurm.hostlist"}
WARM_EXTRA = {
    # launch: rank/binding.py applies the binding (commands/launch.py imports it); with the
    # flight recorder's variables set (every rendered script), also rank/torchnames.py
    "launch": {"slurmfabric.commands.launch", "slurmfabric.rank.binding"},
    # env: textcheck quotes the export lines it prints
    "env": {"slurmfabric._common.textcheck"},
}


TORCHRUN_WORKER = {"TORCHELASTIC_RUN_ID": "sf-41", "MASTER_ADDR": "gpu1", "MASTER_PORT": "29500",
                   "RANK": "8", "LOCAL_RANK": "0", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
                   "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}


@pytest.mark.parametrize("args", [["launch", "--", "true"], ["env"],
                                  ["launch", "--mode", "mpi", "--", "true"],
                                  ["launch", "--mode", "torchrun", "--", "true"]])
def test_a_warm_rank_imports_its_budget_and_nothing_else(tmp_path: Path,
                                                         args: list[str]) -> None:
    """Not rank/addr (only the nodeaddr and iface: address policies load it), not
    _common/gids (only RoCE ports),
    not itertools (hostlist imports it where it expands
    several bracket groups), not _common/sysfs (a cached binding carries its cpulist text),
    for env not rank/binding (binding_env is rank/task.py's), and for a torchrun worker,
    which reads no node list, not slurm/hostlist."""
    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "root")
    env = clean_env(**STEP, SLURMFABRIC_SYSFS_ROOT=str(root),
                    SLURMFABRIC_PLAN_CACHE=str(tmp_path / "cache"),
                    PYTHONPATH=os.pathsep.join(sys.path))
    if "mpi" in args:
        env.update(OMPI_COMM_WORLD_RANK="8", OMPI_COMM_WORLD_SIZE="16",
                   OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="8")
    budget = WARM_RANK | WARM_EXTRA[args[0]]
    if "torchrun" in args:
        env.update(TORCHRUN_WORKER)
        budget -= {"slurmfabric.slurm", "slurmfabric.slurm.hostlist"}
    script = installed(tmp_path)
    shown = ["launch", "--print", *(args[1:] if args[0] == "launch" else ["--", "true"])]
    origins = [imports(script, shown, env)[1] for _ in range(2)]
    assert ["# plan: discovered" in origins[0], "# plan: cache" in origins[1]] == [True, True]
    found, out = imports(script, args, env)
    assert found == budget, sorted(found)
    if args[0] == "launch":  # as a rendered script runs it: the flight recorder's names set
        found, _ = imports(script, args, {**env, "TORCH_FR_BUFFER_SIZE": "2000"})
        assert found == budget | {"slurmfabric.rank.torchnames"}, sorted(found)
    if args == ["env"]:
        assert "export SLURMFABRIC_CPUS=0-13,112-125\n" in out  # rank 0's, from the cache


# --- env ends without the interpreter's finalization, and loses nothing -------------------


def test_env_output_and_exit_codes_are_those_of_main(tmp_path: Path) -> None:
    """Through the pipe (block-buffered stdout): every byte of a long output arrives."""
    script = installed(tmp_path)
    many = {f"SLURMFABRIC_X{i}": "v" * 50 for i in range(400)}
    kept = {"RANK": "5", "LOCAL_RANK": "x" * 3000}  # kept values are echoed in comments
    env = clean_env(**STEP, **many, **kept, SLURMFABRIC_PLAN_CACHE="off",
                    PYTHONPATH=os.pathsep.join(sys.path))
    for args in (["env"], ["env", "--format", "json"], ["env", "--format", "dotenv"]):
        ran = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True)
        inproc = subprocess.run(
            [sys.executable, "-c", "import sys; from slurmfabric.cli import main; "
             f"code = main({args!r}); sys.stdout.flush(); print(code, file=sys.stderr)"],
            env=env, capture_output=True)
        assert ran.returncode == 0 and inproc.stderr.endswith(b"0\n"), ran.stderr
        assert ran.stdout == inproc.stdout and len(ran.stdout) > 3000, args
    bad = subprocess.run([sys.executable, str(script), "env", "--format", "yaml"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--format must be one of" in bad.stderr


@pytest.mark.parametrize("setup", ["import atexit; atexit.register(print, 'atexit ran')",
                                   "import threading, time; threading.Thread(target=lambda: ("
                                   "time.sleep(0.2), print('thread ran'))).start()"])
def test_env_exits_normally_when_something_would_run_at_exit(tmp_path: Path,
                                                             setup: str) -> None:
    env = clean_env(**STEP, SLURMFABRIC_PLAN_CACHE="off", PYTHONPATH=os.pathsep.join(sys.path))
    probe = f"import sys; {setup}\nsys.argv = ['slurmfabric', 'env']\n" \
            "from slurmfabric.cli import run\nrun()\n"
    ran = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0 and "export RANK=8" in ran.stdout
    assert ran.stdout.rstrip().endswith(("atexit ran", "thread ran")), ran.stdout[-200:]


def test_env_skips_finalization_otherwise(tmp_path: Path) -> None:
    """A __del__ of a module global runs at the interpreter's finalization: not after env
    (that is the saving), still after other commands."""
    env = clean_env(**STEP, SLURMFABRIC_PLAN_CACHE="off", PYTHONPATH=os.pathsep.join(sys.path))
    probe = ("import sys\nclass Late:\n    def __del__(self):\n        print('finalized')\n"
             "late = Late()\nsys.argv = ['slurmfabric'] + sys.argv[1:]\n"
             "from slurmfabric.cli import run\nrun()\n")
    quick = subprocess.run([sys.executable, "-c", probe, "env"], env=env, capture_output=True,
                           text=True)
    normal = subprocess.run([sys.executable, "-c", probe, "--version"], env=env,
                            capture_output=True, text=True)
    assert quick.returncode == 0 and "export RANK=8" in quick.stdout
    assert "finalized" not in quick.stdout
    assert normal.stdout == "slurmfabric 0.1.0\nfinalized\n"


# --- launch's exec: os.execvpe's search without its imports -------------------------------

EXEC = """
import os, sys
from slurmfabric.rank import task
fn = {"ours": task.execvpe, "os": os.execvpe}[sys.argv[1]]
env = dict(os.environ)
if sys.argv[2] == "-":
    env.pop("PATH", None)
else:
    env["PATH"] = sys.argv[2]
try:
    fn(sys.argv[3], [sys.argv[3], "ran"], env)
except OSError as error:
    print(type(error).__name__, error.errno)
"""


@pytest.mark.parametrize("case", ["first", "second", "not-executable", "missing", "slash",
                                  "no-path", "empty-entry", "file-as-dir"])
def test_execvpe_searches_path_as_os_execvpe_does(tmp_path: Path, case: str) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    for directory, mode in ((one, 0o644), (two, 0o755)):  # one: present, not executable
        tool = directory / "tool"
        tool.write_text(f"#!/bin/sh\necho {directory.name} \"$1\"\n")
        tool.chmod(mode)
    (two / "only-two").write_text("#!/bin/sh\necho two-only \"$1\"\n")
    (two / "only-two").chmod(0o755)
    (tmp_path / "afile").write_text("")
    path, name = {
        "first": (f"{two}:{one}", "tool"),
        "second": (f"{one}:{two}", "tool"),  # EACCES in one, then runs two's
        "not-executable": (str(one), "tool"),
        "missing": (f"{one}:{two}", "nothing-here"),
        "slash": ("/nonexistent", str(two / "tool")),
        "no-path": ("-", "sh"),  # os.defpath
        "empty-entry": (f":{one}", "tool"),  # '' is the current directory (tmp_path/two)
        "file-as-dir": (f"{tmp_path / 'afile'}:{two}", "only-two"),  # ENOTDIR, then two
    }[case]
    env = clean_env(PYTHONPATH=os.pathsep.join(sys.path))
    out = {impl: subprocess.run([sys.executable, "-c", EXEC, impl, path, name], env=env,
                                cwd=two, capture_output=True, text=True, timeout=30).stdout
           for impl in ("ours", "os")}
    assert out["ours"] == out["os"], case
    expected = {"first": "two ran\n", "second": "two ran\n",
                "not-executable": f"PermissionError {13}\n", "missing": "FileNotFoundError 2\n",
                "slash": "two ran\n", "empty-entry": "two ran\n", "file-as-dir": "two-only ran\n"}
    if case in expected:
        assert out["ours"] == expected[case]


def test_execvpe_keeps_the_exec_error_for_launch() -> None:
    with pytest.raises(FileNotFoundError):
        taskenv.execvpe("definitely-not-a-command-sf", ["x"], {"PATH": "/nonexistent"})
