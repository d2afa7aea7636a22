"""Recording stand-ins for srun, mpirun, torchrun, python, scontrol, hostname, module and
slurmfabric, used by ``slurmfabric import --check`` to run a script with bash on a machine
without Slurm or GPUs.

Each stand-in appends one JSON line to ``$SF_STUB_DIR/calls.jsonl`` (its argv, the launchers
above it and its environment) and then does what the real one would do for task 0 on node 0
of the fake allocation: srun, mpirun and torchrun start their command once (with the rank
variables the real one sets), ``bash -c`` runs in a real bash, and any other program is a
leaf: recorded, never executed. Standard library only: it runs once per stand-in call.
Option syntax: srun(1), mpirun(1) (Open MPI), torchrun (torch.distributed.run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Optional

from slurmfabric.job.launcher_options import (
    MPIRUN_VALUE,
    SRUN_SHORT_VALUE,
    SRUN_VALUE,
    TORCHRUN_VALUE,
)

_PYTHON = re.compile(r"(.*/)?python[0-9.]*\Z")


def record(kind: str, argv: list[str], env: dict[str, str], **extra: object) -> None:
    chain = json.loads(env.get("SF_STUB_CHAIN", "[]"))
    entry = {"kind": kind, "argv": argv, "chain": chain,
             "env": {k: v for k, v in env.items() if not k.startswith("SF_STUB")
                     and k != "BASH_ENV"}, **extra}
    with open(os.path.join(env["SF_STUB_DIR"], "calls.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def _nested(env: dict[str, str], name: str, **values: str) -> dict[str, str]:
    child = dict(env)
    child.update(values)
    child["SF_STUB_CHAIN"] = json.dumps(json.loads(env.get("SF_STUB_CHAIN", "[]")) + [name])
    return child


def emulate(argv: list[str], env: dict[str, str]) -> int:
    if not argv:
        return 0
    name = argv[0].rsplit("/", 1)[-1]
    if name == "srun":
        return _srun(argv, env)
    if name in ("mpirun", "mpiexec"):
        return _mpirun(argv, env)
    if name == "torchrun":
        return _torchrun(argv, 1, _python_of(argv[0]), [], env)
    if _PYTHON.match(name) and len(argv) > 1 and argv[1].endswith("slurmfabric.pyz"):
        return _slurmfabric(["slurmfabric", *argv[2:]], env)  # a container job's zipapp
    if _PYTHON.match(name):
        at = _module_at(argv)
        if at is not None:
            return _torchrun(argv, at, argv[0], argv[:at], env)
    if name in ("bash", "sh") and len(argv) > 2 and argv[1] == "-c":
        record("launcher", argv, env, launcher="bash")
        return subprocess.run(["bash", *argv[1:]], env=_nested(env, "bash"),
                              check=False).returncode
    if name == "slurmfabric":
        return _slurmfabric(argv, env)
    if name == "scontrol":
        if argv[1:3] == ["show", "hostnames"]:
            nodes = int(env.get("SLURM_JOB_NUM_NODES", "1"))
            print("\n".join(f"node{i + 1}" for i in range(nodes)))
        return 0
    if name == "tee":  # the output still flows; no file is written
        record("leaf", argv, env)
        sys.stdout.buffer.write(sys.stdin.buffer.read())
        return 0
    if name == "hostname":
        print(env.get("SLURMD_NODENAME", "node1"))
        return 0
    record("leaf", argv, env)
    return 0


def _python_of(torchrun: str) -> str:
    """The interpreter a torchrun script runs its workers with (its own sys.executable)."""
    return torchrun[: -len("torchrun")] + "python" if "/" in torchrun else "python"


def _module_at(argv: list[str]) -> Optional[int]:
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 2 if argv[i] in ("-X", "-W") else 1
    return i + 2 if argv[i:i + 2] == ["-m", "torch.distributed.run"] else None


def _srun(argv: list[str], env: dict[str, str]) -> int:
    values = SRUN_VALUE
    options: list[str] = []
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        word = argv[i]
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            if not eq and name in values and i + 1 < len(argv):
                options.append(f"--{name}={argv[i + 1]}")
                i += 2
                continue
            options.append(word)
        elif word[1:2] in SRUN_SHORT_VALUE and len(word) == 2 and i + 1 < len(argv):
            options.append(f"{word}{argv[i + 1]}")
            i += 2
            continue
        else:
            options.append(word)
        i += 1
    record("launcher", argv, env, launcher="srun", options=options)
    return emulate(argv[i:], _nested(env, "srun", SLURM_PROCID="0", SLURM_LOCALID="0",
                                     SLURM_STEP_ID="0"))


def _mpirun(argv: list[str], env: dict[str, str]) -> int:
    options: list[str] = []
    child = dict(env)
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        name = argv[i].lstrip("-")
        if name in ("mca", "gmca") and i + 2 < len(argv):
            options += [f"--{name}", argv[i + 1], argv[i + 2]]
            i += 3
            continue
        if name in MPIRUN_VALUE and i + 1 < len(argv):
            value = argv[i + 1]
            if name == "x":
                key, eq, val = value.partition("=")
                if eq:
                    child[key] = val
            else:
                options += [f"--{name}", value]
            i += 2
            continue
        options.append(f"--{name}")
        i += 1
    record("launcher", argv, env, launcher="mpirun", options=options)
    return emulate(argv[i:], _nested(child, "mpirun", OMPI_COMM_WORLD_RANK="0",
                                     OMPI_COMM_WORLD_LOCAL_RANK="0"))


def _torchrun(argv: list[str], start: int, python: str, runner: list[str],
              env: dict[str, str]) -> int:
    values = TORCHRUN_VALUE
    options: dict[str, str] = {}
    module = no_python = False
    i = start
    while i < len(argv) and argv[i].startswith("-"):
        word = argv[i]
        if word in ("-m", "--module"):
            module, i = True, i + 1
            continue
        if word in ("--no-python", "--no_python"):
            no_python, i = True, i + 1
            continue
        name, eq, value = word.lstrip("-").partition("=")
        name = name.replace("_", "-")
        if not eq and name in values and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        else:
            i += 1
        options[name] = value
    record("launcher", argv, env, launcher="torchrun", options=options)
    rest = argv[i:]
    worker = rest if no_python else [python, "-u", *(["-m"] if module else []), *rest]
    return emulate(worker, _nested(env, "torchrun", RANK="0", LOCAL_RANK="0", GROUP_RANK="0"))


def _slurmfabric(argv: list[str], env: dict[str, str]) -> int:
    if argv[1:2] == ["launch"] and "--" in argv:
        return emulate(argv[argv.index("--") + 1:], _nested(env, "slurmfabric"))
    if argv[1:2] == ["zipapp"]:
        print("/dev/null")  # a path that exists: the script checks every node can read it
    if argv[1:2] == ["env"]:
        print(f"export MASTER_ADDR=node1 MASTER_PORT=29500 RDZV_ID={env.get('SLURM_JOB_ID', '1')}")
    return 0


def main() -> None:
    argv = list(sys.argv)
    if argv[1:2] == ["__leaf__"]:  # bash's command_not_found_handle
        record("leaf", argv[2:], dict(os.environ))
        raise SystemExit(0)
    if os.path.dirname(argv[0]) == os.environ.get("SF_STUB_BIN"):
        argv[0] = os.path.basename(argv[0])  # found on PATH: the name the script used
    raise SystemExit(emulate(argv, dict(os.environ)))
