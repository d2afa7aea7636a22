"""Bad input to every command that reads a file, a directory, an expression or a number.

Each (command, input) runs as a real subprocess under an address-space limit and a
deadline; it must end with exit code 1 or 2 (2 for input that is not what the command
reads), print at most a one-line error (plus an optional HINT line) and never a
traceback or slurmfabric's "internal error" (exit 70).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.hostile

MEMORY_LIMIT = 1 << 30  # address space: a reader that slurps /dev/zero dies here
DEADLINE = 30

# name -> bytes (None: made specially below)
CONTENTS: dict[str, bytes | None] = {
    "empty": b"",
    "binary": bytes(range(256)) * 64,
    "nul": b"\x00" * 4096,
    "not-utf8": b"caf\xe9 \xff\xfe\n" * 10,
    "truncated-json": b'{"links": [{"a": ',
    "json-list": b"[]",
    "json-string": b'"links"',
    "json-wrong-types": json.dumps({"links": 5, "nodes": "x", "rounds": 7,
                                    "slurmfabric_topology": 1, "topology": []}).encode(),
    "json-deep": b"[" * 200000 + b"]" * 200000,
    "json-huge-int": b'{"links": [' + b"9" * 5000 + b"]}",
    "huge-line": b"NCCL INFO " + b"x" * (20 << 20) + b"\n",
    "big-sparse": None,  # 100 MB of zeros (a sparse file)
    "directory": None,
    "fifo": None,
    "dangling": None,
    "dev-zero": None,
}


def make(tmp: Path, name: str) -> Path:
    path = tmp / f"in-{name}"
    content = CONTENTS[name]
    if content is not None:
        path.write_bytes(content)
    elif name == "big-sparse":
        with open(path, "wb") as handle:
            handle.truncate(100 << 20)
    elif name == "directory":
        path.mkdir()
    elif name == "fifo":
        os.mkfifo(path)
    elif name == "dangling":
        path.symlink_to(tmp / "nowhere")
    elif name == "dev-zero":
        return Path("/dev/zero")
    return path


# command template -> {IN} is the bad input; each runs for every input kind
COMMANDS = [
    ["nccl-log", "{IN}"],
    ["nccl-tests", "parse", "{IN}"],
    ["nccl-tests", "parse", "{IN}", "--ports", "8"],
    ["ib", "links", "--input", "{IN}"],
    ["ib", "audit", "--input", "{IN}"],
    ["ib", "audit", "--input", "{GOOD_LINKS}", "--baseline", "{IN}"],
    ["ib", "audit", "--input", "{GOOD_LINKS}", "--node-map", "{IN}"],
    ["topo", "--from", "{IN}"],
    ["topo", "--sysfs-root", "{IN}"],
    ["pairs", "report", "{DIR_WITH_PLAN}"],
    ["render", "--from-script", "{IN}"],
    ["render", "-c", "{IN}"],
    ["submit", "--dry-run", "-c", "{IN}"],
    ["health", "check", "--config", "{IN}"],
    ["roce", "report", "{DIR_WITH_SAMPLE}"],
    ["site", "cli-filter", "--config", "{IN}"],
    ["site", "install", "{TMP}/hooks", "--config", "{IN}"],
]
# option values and expressions that are not what the command accepts
ARGUMENTS = [
    ["nccl-tests", "parse", "{LOG}", "--rates", "nan,400"],
    ["nccl-tests", "parse", "{LOG}", "--rates", "-400"],
    ["nccl-tests", "parse", "{LOG}", "--ports", "0"],
    ["nccl-tests", "parse", "{LOG}", "--ports", "8", "--port-rate", "inf"],
    ["nccl-tests", "parse", "{LOG}", "--expect-busbw", "-5"],
    ["ib", "audit", "--input", "{GOOD_LINKS}", "--expect-rate", "nan"],
    ["ib", "links", "--input", "{GOOD_LINKS}", "--ibdiag-args", "-C 'mlx5_0"],
    ["ib", "links", "--iblinkinfo", "{NOT_EXEC}"],
    ["pairs", "submit", "--nodes", "n[1-4]", "--results", "{TMP}/r", "--command", 'x "y',
     "--dry-run"],
    ["pairs", "report", "{TMP}/no-such-dir"],
    ["pairs", "report", "{FILE_NOT_DIR}"],
    ["hostlist", "index", "a[1-65536]b[1-65536]", "a5b5"],
    ["hostlist", "compress", "a[1-65536]b[1-65536]"],
    ["hostlist", "expand", "n[1-99999999999999999999]"],
    ["hostlist", "count", "n[" + "9" * 5000 + "]"],
    ["render", "--set", "job.nodes=" + "9" * 5000],
    ["render", "-o", "{TMP}", "--set", "launcher.type=srun", "--set", "job.ntasks_per_node=1",
     "--set", 'program.command=["x"]'],
    ["render", "-o", "{TMP}/missing/dir/x.sh", "--set", "launcher.type=srun",
     "--set", "job.ntasks_per_node=1", "--set", 'program.command=["x"]'],
    ["topo", "snapshot", "-o", "{TMP}/missing/dir/x.tar.gz"],
    ["topo", "--ntasks", "-3"],
    ["env", "--port-range", "99999-1"],
    ["launch", "--mode", "bogus", "--", "true"],
    ["pairs", "submit", "--nodes", "n[1-4]", "--results", "{TMP}/r", "--pattern", "k-batch",
     "--batch", "9", "--dry-run"],
    ["pairs", "submit", "--nodes", "n[1-4]", "--results", "{TMP}/r", "--pattern", "k-batch",
     "--dry-run"],
    ["roce", "audit", "--nodes", "n[1-4]", "--results", "relative/dir", "--dry-run"],
    ["roce", "audit", "--nodes", "n[1-4]", "--results", "{TMP}/r", "--interval", "nan",
     "--dry-run"],
    ["roce", "report", "{TMP}/no-such-dir"],
    ["roce", "report", "{TMP}"],
    ["site", "install", "{TMP}/hooks2", "--python", "python3"],
]
GOOD_LINKS = (Path(__file__).resolve().parents[1] / "fixtures" / "ib")


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    env.update(SLURMFABRIC_SITE_DEFAULTS="", SLURM_JOB_ID="7", SLURM_JOB_NODELIST="n1",
               SLURM_JOB_NUM_NODES="1")
    return subprocess.run([sys.executable, "-m", "slurmfabric", *argv], cwd=cwd, env=env,
                          capture_output=True, timeout=DEADLINE, preexec_fn=_limits,
                          stdin=subprocess.DEVNULL)


# (command, input) pairs where the input is legitimately fine: an empty node map or an
# empty health config (all defaults) are valid files.
VALID = {("--node-map", "empty"), ("check", "empty")}


def _check(argv: list[str], proc: subprocess.CompletedProcess,
           kind: str | None = None) -> str | None:
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode == 0 and any(flag in argv and kind == name for flag, name in VALID):
        return None
    lines = [line for line in err.splitlines() if line.strip()]
    if "Traceback" in err or proc.returncode == 70 or "internal error" in err:
        return f"{argv}: traceback/internal error (rc {proc.returncode}): {err[-600:]}"
    if proc.returncode not in (1, 2):
        return f"{argv}: exit {proc.returncode} (want 1 or 2): {err[-300:]}"
    errors = [line for line in lines if "error" in line.lower()]
    if proc.returncode == 2 and not errors:
        return f"{argv}: exit 2 without an error line: {err[-300:]}"
    if len([line for line in lines if not line.startswith(("HINT:", "usage:", " "))]) > 3:
        return f"{argv}: more than a short error: {err[-600:]}"
    return None


def _good_links() -> str:
    candidates = sorted(GOOD_LINKS.glob("*iblinkinfo*.txt"))
    assert candidates, f"no recorded iblinkinfo under {GOOD_LINKS}"
    return str(candidates[0])


def test_every_command_refuses_bad_input_cleanly(tmp_path: Path, hostile_report) -> None:
    inputs = {name: make(tmp_path, name) for name in CONTENTS}
    plan_dirs, sample_dirs = {}, {}
    for name, path in inputs.items():
        if name in ("directory", "fifo", "dangling", "dev-zero", "big-sparse"):
            continue
        directory = tmp_path / f"results-{name}"
        directory.mkdir()
        (directory / "plan.json").write_bytes(path.read_bytes())
        plan_dirs[name] = directory
        samples = tmp_path / f"samples-{name}"
        samples.mkdir()
        (samples / "n1.0.json").write_bytes(path.read_bytes())
        sample_dirs[name] = samples
    not_exec = tmp_path / "not-exec"
    not_exec.write_text("#!/bin/sh\n")
    log = tmp_path / "ok.log"
    log.write_text("# nothing\n")
    file_not_dir = tmp_path / "a-file"
    file_not_dir.write_text("x")
    subs = {"{GOOD_LINKS}": _good_links(), "{TMP}": str(tmp_path), "{NOT_EXEC}": str(not_exec),
            "{LOG}": str(log), "{FILE_NOT_DIR}": str(file_not_dir)}
    runs: list[list[str]] = []
    for template in COMMANDS:
        for name, path in inputs.items():
            if "{DIR_WITH_PLAN}" in template:
                if name not in plan_dirs:
                    continue
                subs_here = {**subs, "{DIR_WITH_PLAN}": str(plan_dirs[name])}
            elif "{DIR_WITH_SAMPLE}" in template:
                if name not in sample_dirs:
                    continue
                subs_here = {**subs, "{DIR_WITH_SAMPLE}": str(sample_dirs[name])}
            else:
                subs_here = {**subs, "{IN}": str(path)}
            runs.append(([_fill(arg, subs_here) for arg in template], name))
    runs += [([_fill(arg, subs) for arg in template], None) for template in ARGUMENTS]
    failures = []
    for argv, kind in runs:
        try:
            proc = _run(argv, tmp_path)
        except subprocess.TimeoutExpired:
            failures.append(f"{argv}: no answer within {DEADLINE} s")
            continue
        problem = _check(argv, proc, kind)
        if problem:
            failures.append(problem)
    hostile_report(f"bad inputs: {len(runs)} command runs, {len(failures)} problems "
                   f"(address space {MEMORY_LIMIT >> 20} MiB, deadline {DEADLINE} s each)")
    assert not failures, "\n".join(failures[:25]) + f"\n... {len(failures)} problems"


def _fill(arg: str, subs: dict[str, str]) -> str:
    for key, value in subs.items():
        arg = arg.replace(key, value)
    return arg
