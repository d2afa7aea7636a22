"""The flight recorder's variable names as the rank's torch reads them (rank/torchnames.py).

torch 2.13.0 (the CPU build the demo and these tests install) prints "Environment variable
TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; use TORCH_FR_BUFFER_SIZE instead" once per
process whenever the old name is set, even beside the new one; torch <= 2.7 reads only the
old names. The real torch run below shows no such line; an older torch is a directory
layout with its dist-info, read without importing anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from slurmfabric.rank import torchnames

DEPRECATED = "is deprecated; use TORCH_FR_"


def _prefix(tmp: Path, torch: str | None, venv: bool = True) -> Path:
    """A Python prefix as pip lays it out: bin/python and a site directory holding torch."""
    (tmp / "bin").mkdir(parents=True)
    (tmp / "bin" / "python").symlink_to(sys.executable)
    site = tmp / "lib" / "python3.11" / ("site-packages" if venv else "dist-packages")
    site.mkdir(parents=True)
    if venv:
        (tmp / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = "
                                        "false\n")
    if torch:  # what a torch wheel installs: the package with its version.py, and dist-info
        (site / "torch").mkdir()
        (site / "torch" / "version.py").write_text(f"__version__ = '{torch}'\ndebug = False\n")
        (site / f"torch-{torch}.dist-info").mkdir()
    return tmp


def test_the_programs_torch_is_read_from_its_dist_info(tmp_path: Path) -> None:
    old = _prefix(tmp_path / "old", "2.7.1+cu126")
    new = _prefix(tmp_path / "new", "2.13.0+cpu")
    env = {"PATH": f"{old}/bin:/usr/bin"}
    assert torchnames.program_torch(["python", "-m", "train"], env) == (2, 7)
    assert torchnames.program_torch([f"{new}/bin/python", "t.py"], env) == (2, 13)
    # a console script (torchrun) or an executable train.py: its #! line names the Python
    script = tmp_path / "train.py"
    script.write_text(f"#!{new}/bin/python\nprint()\n")
    script.chmod(0o755)
    assert torchnames.program_torch([str(script)], env) == (2, 13)
    script.write_text("#!/usr/bin/env -S python -u\nprint()\n")
    assert torchnames.program_torch([str(script)], env) == (2, 7)  # python on PATH: old
    # Debian's layout (an NGC image's pip installs): /usr/local/lib/python3.X/dist-packages
    image = _prefix(tmp_path / "usr" / "local", "2.5.0a0+872d972e41", venv=False)
    (tmp_path / "usr" / "bin").mkdir()
    (tmp_path / "usr" / "bin" / "python3").symlink_to(sys.executable)
    assert image.is_dir()
    assert torchnames.program_torch([str(tmp_path / "usr" / "bin" / "python3")], {}) == (2, 5)
    # PYTHONPATH comes first, as site.py orders it; a torch without version.py: its dist-info
    extra = tmp_path / "extra"
    (extra / "torch-2.9.0.dist-info").mkdir(parents=True)
    (extra / "torch").mkdir()
    (tmp_path / "stale" / "torch-2.4.0.dist-info").mkdir(parents=True)  # metadata, no package
    env["PYTHONPATH"] = str(tmp_path / "stale")
    assert torchnames.program_torch(["python"], env) == (2, 7)
    del env["PYTHONPATH"]
    assert torchnames.program_torch(["python"], {**env, "PYTHONPATH": str(extra)}) == (2, 9)
    assert torchnames.program_torch(["bash", "run.sh"], env) is None
    assert torchnames.program_torch(["no-such-program"], env) is None


def test_old_names_are_added_only_for_a_torch_before_2_8(tmp_path: Path) -> None:
    old = _prefix(tmp_path / "old", "2.7.1")
    new = _prefix(tmp_path / "new", "2.8.0")
    script = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "/j/nccl_trace_7_rank_",
              "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    env = {**script, "PATH": f"{old}/bin"}
    assert torchnames.adapt(env, ["python", "train.py"]) == (2, 7)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/j/nccl_trace_7_rank_"
    env = {**script, "PATH": f"{new}/bin"}
    assert torchnames.adapt(env, ["python", "train.py"]) == (2, 8)
    assert env == {**script, "PATH": f"{new}/bin"}  # 2.8 reads the new names: nothing added
    # no torch found: both names, so an old torch still dumps (a new one warns once)
    env = {**script, "PATH": "/nonexistent"}
    assert torchnames.adapt(env, ["bash", "run.sh"]) is None
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    # an old name the user set is theirs: never overwritten
    env = {**script, "TORCH_NCCL_TRACE_BUFFER_SIZE": "64", "PATH": f"{old}/bin"}
    torchnames.adapt(env, ["python"])
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "64"
    # without the script's names there is nothing to look for
    env = {"PATH": f"{old}/bin"}
    assert torchnames.adapt(env, ["python"]) is None and env == {"PATH": f"{old}/bin"}


def _launch_env(tmp: Path, path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "TORCH_", "PET_", "MASTER_", "RANK", "WORLD_"))}
    return {**env, "PATH": path, "TORCH_FR_BUFFER_SIZE": "2000",
            "TORCH_FR_DUMP_TEMP_FILE": f"{tmp}/nccl_trace_rank_",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "OMP_NUM_THREADS": "1"}


ALLREDUCE = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
# one write(2) per line: two ranks print to the same pipe, and print() writes in pieces
os.write(1, f"rank {dist.get_rank()} sum {int(t.item())} old "
            f"{os.environ.get('TORCH_NCCL_TRACE_BUFFER_SIZE')}\\n".encode())
dist.destroy_process_group()
"""


def test_a_real_torch_run_through_launch_prints_no_deprecation(tmp_path: Path) -> None:
    """torchrun -> slurmfabric launch -> python, 2 gloo ranks on the CPU build of torch 2.13:
    the variables as the script sets them reach the ranks, and no rank warns."""
    import torch

    assert tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 8)
    program = tmp_path / "allreduce.py"
    program.write_text(ALLREDUCE)
    bindir = str(Path(sys.executable).parent)
    env = _launch_env(tmp_path, f"{bindir}:/usr/bin:/bin")
    run = subprocess.run([f"{bindir}/torchrun", "--nnodes", "1", "--nproc-per-node", "2",
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
                          "--no-python", f"{bindir}/slurmfabric", "launch", "--mode",
                          "torchrun", "--no-bind", "--", "python", str(program)],
                         env=env, capture_output=True, text=True, timeout=240)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert sorted(line for line in run.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 sum 2 old None", "rank 1 sum 2 old None"]
    assert DEPRECATED not in out
    # the check can fail: the old name, set as scripts did before, warns on each rank
    control = subprocess.run([sys.executable, "-c", ALLREDUCE], capture_output=True, text=True,
                             env={**env, "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "RANK": "0",
                                  "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                  "MASTER_PORT": str(_free_port())}, timeout=120)
    assert control.returncode == 0, control.stderr
    assert "Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; use " \
        "TORCH_FR_BUFFER_SIZE instead" in control.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_gives_an_old_torch_its_old_names(tmp_path: Path) -> None:
    """The program's python is an older torch's (its dist-info says 2.7.1): launch execs it
    with the old names beside the new ones. The 'python' is a fake binary that prints the
    environment it was given."""
    prefix = _prefix(tmp_path / "venv", "2.7.1+cu126")
    fake = prefix / "bin" / "python"
    fake.unlink()
    fake.write_text("#!/bin/sh\nenv | grep '^TORCH_' | sort\n")
    fake.chmod(0o755)
    env = {**_launch_env(tmp_path, f"{prefix}/bin:/usr/bin:/bin"), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "t"}
    run = subprocess.run([sys.executable, "-m", "slurmfabric", "launch", "--mode", "torchrun",
                          "--no-bind", "--", "python", "train.py"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got = dict(line.split("=", 1) for line in run.stdout.splitlines())
    assert got["TORCH_NCCL_TRACE_BUFFER_SIZE"] == got["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert got["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{tmp_path}/nccl_trace_rank_"


def test_diagnose_reads_dumps_written_under_either_name(tmp_path: Path, monkeypatch) -> None:
    """Two ranks of one job on this node: one told the new name (torch >= 2.8), one only the
    old (a script of its own, an older torch); the collector reads both ranks' dumps."""
    import pickle

    from flightdump import fr_dump

    from slurmfabric.progress import collect as collector
    from slurmfabric.progress import flight

    monkeypatch.setattr(collector, "pyspy_path", lambda: None)
    job = str(900000 + os.getpid() % 99999)
    names = {0: "TORCH_FR_DUMP_TEMP_FILE", 1: "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
    procs = []
    try:
        for rank, name in names.items():
            prefix = f"{tmp_path}/{name.lower()}_"
            Path(f"{prefix}{rank}").write_bytes(pickle.dumps(fr_dump(5 + rank)))
            env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "RANK": str(rank),
                   name: prefix}
            procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                          env=env))
        import time

        time.sleep(0.5)
        _, node = collector.collect(job)
        got = node["flight"]
        assert sorted(got) == ["0", "1"], got
        assert got["1"]["groups"]["0"]["last_enqueued"] == 6
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    same = {"TORCH_FR_DUMP_TEMP_FILE": "/j/p_", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/j/p_"}
    assert flight.prefixes_from_env(same) == ["/j/p_"]  # an old torch's rank: one prefix
    assert flight.prefixes_from_env({}) == [flight.DEFAULT_PREFIX]
