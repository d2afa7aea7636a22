"""The Slurm layer owns every Slurm call (issue 44): no module outside slurmfabric/slurm/
names a Slurm client command in a process argv or imports pyslurm; and ``submit --backend
auto --dry-run`` touches no Slurm, proved with recording Slurm binaries on PATH and a
recording pyslurm on the import path."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slurmfabric"
LAYER = PACKAGE / "slurm"
CONFIG = ROOT / "examples" / "smoke-cpu.toml"

# Slurm's client commands (the man pages of Slurm 22.05-25.11, section 1).
SLURM_COMMANDS = frozenset({
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
    "scrontab", "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat",
    "strigger", "sview",
})

# Calls that start a process or look a program up: their first argument is an argv, a
# shell line or a program name.
SPAWNERS = frozenset({
    "run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput",
    "system", "popen", "execv", "execve", "execvp", "execvpe", "execl", "execlp", "execle",
    "execlpe", "spawnv", "spawnvp", "spawnve", "spawnvpe", "spawnl", "spawnlp",
    "posix_spawn", "posix_spawnp", "create_subprocess_exec", "create_subprocess_shell",
    "which", "spawn",
})

# Outside this item's reach, each with its reason; every entry must still exist.
ALLOWED = {
    # The importer's real check (`import --check --real`) runs the imported script's own
    # sbatch/scontrol/scancel under a sandboxed PATH and environment; job/importer/ is
    # being made its own package by another item of issue 44 (5), which moves these calls.
    "job/importer/realcheck.py",
}


def _slurm_word(node: ast.AST | None) -> str | None:
    """The Slurm command a constant (or an f-string's leading text) starts with."""
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        words = node.value.split()
        if words and os.path.basename(words[0]) in SLURM_COMMANDS:
            return os.path.basename(words[0])
    return None


def _argv_head(node: ast.AST | None) -> ast.AST | None:
    """The first item of an argv literal (``[...]``, ``(...)``, ``[...] + rest``)."""
    if isinstance(node, ast.BinOp):
        return _argv_head(node.left)
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        first = node.elts[0]
        return None if isinstance(first, ast.Starred) else first
    return node


def _optionish(node: ast.AST) -> bool:
    """An argv item that can only be an option or a Key=Value of a command line."""
    if isinstance(node, ast.JoinedStr):
        return True
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and (
        node.value.startswith("-") or "=" in node.value)


def slurm_calls(source: str) -> list[str]:
    """Where ``source`` names a Slurm command in a process argv or imports pyslurm: one
    ``line: what`` per finding."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "pyslurm"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == \
                "pyslurm":
            found.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            first = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg in ("args", "cmd", "file")), None)
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                    and str(first.value).split(".")[0] == "pyslurm":
                found.append(f"{node.lineno}: {name}({first.value!r})")
            word = _slurm_word(_argv_head(first)) if name in SPAWNERS else None
            if word:
                found.append(f"{node.lineno}: {name}() runs {word}")
        elif isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            # an argv built apart from the call that runs it: the command alone as its
            # first item, then options (a script's text, "srun --x ..." words joined by
            # the job's renderer, is the job's, not a call)
            head = node.elts[0]
            word = _slurm_word(head) if isinstance(head, ast.Constant) and len(
                str(head.value).split()) == 1 else None
            if word and any(_optionish(item) for item in node.elts[1:]):
                found.append(f"{node.lineno}: argv {word} ...")
    return found


def test_no_module_outside_the_slurm_layer_calls_slurm_or_imports_pyslurm() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if path.is_relative_to(LAYER) or relative in ALLOWED:
            continue
        found = slurm_calls(path.read_text(encoding="utf-8"))
        if found:
            offenders[relative] = found
    assert not offenders, (
        "Slurm calls outside slurmfabric/slurm/ (add a function there, call it): "
        f"{offenders}")
    for relative in ALLOWED:
        assert (PACKAGE / relative).is_file(), f"ALLOWED names a file that is gone: {relative}"


# The shapes the layer test exists for, as they stood before issue 44 moved them (health/
# history.py, restart/supervisor.py, progress/diagnose.py, the testbed), and what it must
# let through (the backend names, a launcher vocabulary).
CAUGHT = {
    "sacctmgr argv": """
        def events_command(start, end):
            cmd = ["sacctmgr", "-n", "-P", "list", "events", "Event=Node",
                   f"Start={start:%Y-%m-%dT%H:%M:%S}"]
            return cmd
    """,
    "scontrol update": """
        cmd.run(["scontrol", "update", f"JobId={target}", f"ExcNodeList={nodes}"])
    """,
    "srun overlap": """
        argv = ["srun", "--overlap", f"--jobid={job_id}", *counts, "--", python]
    """,
    "subprocess argv": """
        proc = subprocess.run(["sacctmgr", "-i", "add", "cluster", name], env=env)
    """,
    "shell line": "os.system('scancel 42')",
    "which": "shutil.which('sbatch')",
    "path to a command": "subprocess.check_output(['/usr/bin/squeue', me])",
    "import": "import pyslurm",
    "from import": "from pyslurm import JobSubmitDescription",
    "import_module": "importlib.import_module('pyslurm')",
}
LET_THROUGH = """
    BACKENDS = ("sbatch", "pyslurm", "auto")
    LAUNCHERS = ("srun", "mpirun", "torchrun")
    choices = ("scontrol", "pyslurm")
    if name == "srun":
        pass
    subprocess.run([binary, "--shell=bash"])
    words = [f"srun --job-name={name}", layout, "--kill-on-bad-exit=1"]
    cmd.update_job(target, ExcNodeList=nodes)
"""


@pytest.mark.parametrize("shape", sorted(CAUGHT))
def test_the_layer_test_catches_each_shape(shape: str) -> None:
    assert slurm_calls(textwrap.dedent(CAUGHT[shape])), shape


def test_the_layer_test_lets_names_through() -> None:
    assert slurm_calls(textwrap.dedent(LET_THROUGH)) == []


# --- submit --backend auto --dry-run -----------------------------------------------------

_RECORDER = "#!/bin/sh\nprintf '%s %s\\n' \"$0\" \"$*\" >> {log}\necho 'slurm 25.11.2'\n"


def _recording_slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Every Slurm client command on PATH records its call; a pyslurm on the import path
    records its import (importing pyslurm initialises libslurm and reads slurm.conf)."""
    bin_dir, lib = tmp_path / "bin", tmp_path / "lib"
    log = tmp_path / "called"
    bin_dir.mkdir()
    for name in SLURM_COMMANDS:
        (bin_dir / name).write_text(_RECORDER.format(log=log))
        (bin_dir / name).chmod(0o755)
    (lib / "pyslurm").mkdir(parents=True)
    (lib / "pyslurm" / "__init__.py").write_text(
        f"open({str(log)!r}, 'a').write('import pyslurm\\n')\n")
    meta = lib / "pyslurm-25.11.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: pyslurm\nVersion: 25.11.2\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    return env, log


@pytest.mark.parametrize("pyslurm", [False, True], ids=["without-pyslurm", "with-pyslurm"])
def test_auto_dry_run_touches_no_slurm(tmp_path: Path, pyslurm: bool) -> None:
    env, log = _recording_slurm(tmp_path)
    if pyslurm:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tmp_path / "lib"), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "slurmfabric", "submit", "-c", str(CONFIG), "--backend",
         "auto", "--dry-run"], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=120)
    assert done.returncode == 0, done.stderr
    assert not log.exists(), f"a dry run called Slurm: {log.read_text()}"
    if pyslurm:  # the installed pyslurm decides, without asking the running Slurm
        assert "pyslurm.JobSubmitDescription" in done.stdout, done.stdout
    assert "#SBATCH --nodes=2" in done.stdout
    # the same recorders do see a call that does reach Slurm, so the check above can fail
    env.pop("PYTHONPATH", None)
    subprocess.run([sys.executable, "-m", "slurmfabric", "submit", "--backend", "sbatch",
                    "--test-only", "-c", str(CONFIG)],
                   capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert "sbatch --test-only" in log.read_text()
