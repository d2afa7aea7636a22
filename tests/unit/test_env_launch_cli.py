"""``slurmfabric env`` / ``launch`` / ``hostlist`` as commands, in subprocesses."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from slurmfabric.rank.task import quote

BATCH = {
    "SLURM_JOB_ID": "77",
    "SLURM_CLUSTER_NAME": "c",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURMFABRIC_NO_PLAN": "1",
}
STEP = {
    **BATCH,
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
}


def run(args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "MASTER_")) or k == "SLURMFABRIC_PLAN_CACHE"}
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "slurmfabric", *args], env=env, capture_output=True, text=True
    )


def test_env_export_lines_eval_in_a_shell():
    proc = run(["env"], BATCH)
    assert proc.returncode == 0, proc.stderr
    shell = subprocess.run(
        ["sh", "-c", proc.stdout + '\necho "$MASTER_ADDR:$MASTER_PORT $NNODES $RDZV_ID"'],
        capture_output=True,
        text=True,
    )
    addr, nnodes, rdzv = shell.stdout.split()
    assert addr.startswith("n1:") and nnodes == "2" and rdzv == "c-77"
    assert "RANK=" not in proc.stdout.replace("NODE_RANK", "")  # job level only


def test_env_json_inside_a_task():
    proc = run(["env", "--format", "json"], STEP)
    data = json.loads(proc.stdout)
    assert (data["RANK"], data["NODE_RANK"], data["WORLD_SIZE"]) == ("1", "1", "2")


def test_env_dotenv_and_errors():
    proc = run(["env", "--format=dotenv"], STEP)
    assert "RANK=1\n" in proc.stdout and "export" not in proc.stdout
    proc = run(["env", "--format", "yaml"], STEP)
    assert proc.returncode == 2 and "--format must be one of" in proc.stderr
    proc = run(["env"], {"SLURMFABRIC_NO_PLAN": "1"})
    assert proc.returncode == 1
    assert proc.stderr.startswith("slurmfabric: error: SLURM_JOB_ID or SLURM_JOBID is not set")
    assert "Traceback" not in proc.stderr


def test_launch_execs_the_command_with_the_env_and_its_exit_code():
    code = "import os,sys; print(os.environ['RANK'], os.getppid()); sys.exit(7)"
    proc = run(["launch", "--", sys.executable, "-c", code], STEP)
    assert proc.returncode == 7  # the program's own exit code: no wrapper in between
    assert proc.stdout.split()[0] == "1"


def test_launch_print_and_missing_command():
    proc = run(["launch", "--print", "--", "python", "a b.py"], STEP)
    assert proc.returncode == 0 and "exec python 'a b.py'" in proc.stdout
    assert run(["launch", "--", "no-such-program-xyz"], STEP).returncode == 127
    assert run(["launch"], STEP).returncode == 2


def test_hostlist_command():
    assert run(["hostlist", "expand", "n[1-3]"], {}).stdout.split() == ["n1", "n2", "n3"]
    assert run(["hostlist", "compress", "n1", "n2", "n4"], {}).stdout.strip() == "n[1-2,4]"
    assert run(["hostlist", "count", "n[1-3],m[01-10]"], {}).stdout.strip() == "13"
    assert run(["hostlist", "index", "n[1-3]", "n3"], {}).stdout.strip() == "2"
    bad = run(["hostlist", "expand", "n[3-1]"], {})
    assert bad.returncode == 2 and "position 2" in bad.stderr


@pytest.mark.parametrize("value", ["", "plain", "a b", "it's", "$(x)", "n[1-2]", "a\nb", "é"])
def test_quote_matches_shlex(value):
    assert quote(value) == shlex.quote(value)


def test_env_and_launch_import_no_heavy_modules():
    """pydantic, jinja2, torch, psutil, argparse, dataclasses stay off the per-rank path."""
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['slurmfabric', 'env']\n"
        "from slurmfabric import cli\n"
        "cli.main(['env']); cli.main(['launch', '--print', '--', 'true'])\n"
        "heavy = {'pydantic', 'pydantic_settings', 'jinja2', 'torch', 'psutil', 'argparse',\n"
        "         'dataclasses', 'typing', 'shlex', 'socket'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, **STEP}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# Modules that would cost milliseconds on every rank: heavy dependencies, and the stdlib
# modules the topology/plan code avoids (dataclasses -> inspect, pathlib, typing, json, re,
# ipaddress, socket, enum, platform, contextlib -> collections + functools). The console
# script does not import contextlib/collections itself (``python -m`` does, via runpy).
PER_RANK_HEAVY = (
    "pydantic", "pydantic_settings", "jinja2", "torch", "psutil", "pynvml", "argparse",
    "dataclasses", "inspect", "typing", "pathlib", "json", "re", "ipaddress", "socket",
    "shlex", "enum", "platform", "encodings.idna", "contextlib", "collections", "functools",
)  # fmt: skip


def test_env_and_launch_with_the_plan_import_no_heavy_modules(tmp_path):
    """On a GPU/RDMA node (the H100 fixture) env and launch discover and plan, and still
    import none of the modules above: the per-rank start-up budget (benchmarks/bench_startup.py).
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [here, os.path.join(here, "fixtures", "topology")]
    try:
        import fakesysfs
        import nodes
    finally:
        del sys.path[:2]
    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "h100")
    step = {k: v for k, v in STEP.items() if k != "SLURMFABRIC_NO_PLAN"}
    step.update(SLURM_STEP_TASKS_PER_NODE="8(x2)", SLURM_STEP_NUM_TASKS="16", SLURM_LOCALID="1")
    probe = (
        "import sys\n"
        "from slurmfabric import cli\n"
        "cli.main(['env']); cli.main(['launch', '--print', '--', 'true'])\n"
        f"print(sorted(set({PER_RANK_HEAVY!r}) & set(sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "MASTER_")) or k == "SLURMFABRIC_PLAN_CACHE"}
    env.update(step, SLURMFABRIC_SYSFS_ROOT=str(root))
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # the plan really ran: rails from the fixture and a CPU binding for local rank 1
    assert "export NCCL_IB_HCA==mlx5_0:1," in proc.stdout
    assert "# binding: local_rank=1 gpu=1 nic=mlx5_1:1 cpus=14-27,126-139 mem_node=0" \
        in proc.stdout
    assert "export SLURMFABRIC_NIC=mlx5_1:1\n" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_batch_shell_on_the_master_takes_the_next_port_a_live_job_holds(tmp_path):
    ports_dir = tmp_path / "ports"
    ports_dir.mkdir()
    # job 76 (this test process stands in for its slurmstepd) holds port 21000
    with open(f"/proc/{os.getpid()}/stat") as stat:
        start = stat.read().rsplit(")", 1)[1].split()[19]
    (ports_dir / "21000").write_text(f"76 {os.getpid()} {start}\n")
    batch = {**BATCH, "SLURMD_NODENAME": "n1", "SLURMFABRIC_PORT_DIR": str(ports_dir),
             "SLURMFABRIC_PORT_RANGE": "21000-21009", "SLURMFABRIC_ALLOW_LOOPBACK": "1"}
    proc = run(["env", "--format", "json", "--port", "21000"], batch)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["MASTER_PORT"] == "21001"
    assert (ports_dir / "21001").read_text().split()[0] == "77"
    # not on the master node (e.g. salloc on a login node): nothing to check, no reservation
    away = {**batch, "SLURMD_NODENAME": "login1"}
    assert json.loads(run(["env", "--format", "json", "--port", "21000"], away).stdout)[
        "MASTER_PORT"] == "21000"
    bad = run(["env", "--port", "80"], batch)
    assert bad.returncode == 2 and "--port/SLURMFABRIC_PORT '80' is not a port inside the " \
        "range 21000-21009" in bad.stderr and "Traceback" not in bad.stderr


def test_launch_refuses_a_fabric_type_the_node_cannot_honour(tmp_path):
    step = {k: v for k, v in STEP.items() if k != "SLURMFABRIC_NO_PLAN"}
    step.update(SLURMFABRIC_FABRIC_TYPE="ib", SLURMD_NODENAME="n2",
                SLURMFABRIC_SYSFS_ROOT=str(tmp_path))  # an empty node: no GPU, no RDMA
    proc = run(["launch", "--", "true"], step)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert ("fabric.type=ib but node n2 has no usable InfiniBand rail: found no RDMA devices"
            in proc.stderr)
    shown = run(["launch", "--print", "--", "true"], step)
    assert shown.returncode == 1 and "# slurmfabric: error: fabric.type=ib" in shown.stdout
    assert run(["launch", "--fabric-type", "auto", "--", "true"], step).returncode == 0


def test_a_cpu_node_never_imports_the_plan(tmp_path):
    """No GPU and no RDMA device (this machine): env/launch skip discovery entirely, for
    auto and tcp alike; ib on such a node is an error, not a silent TCP job."""
    from slurmfabric.rank.task import _has_accelerators

    assert not _has_accelerators(), "this test needs a machine without GPUs and RDMA devices"
    step = {k: v for k, v in STEP.items() if k != "SLURMFABRIC_NO_PLAN"}
    probe = (
        "import sys\nfrom slurmfabric import cli\n"
        "cli.main(['launch', '--print', '--', 'true'])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('slurmfabric.plan', "
        "'slurmfabric.topology'))))\n"
    )
    for kind in ("auto", "tcp"):
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              env={**os.environ, **step, "SLURMFABRIC_FABRIC_TYPE": kind})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == "[]", (kind, proc.stdout)
    proc = run(["launch", "--", "true"], {**step, "SLURMFABRIC_FABRIC_TYPE": "roce",
                                           "SLURMD_NODENAME": "n2"})
    assert proc.returncode == 1 and "fabric.type=roce but node n2 has no GPU and no RDMA " \
        "device" in proc.stderr
    proc = run(["launch", "--", "true"], {**step, "SLURMFABRIC_FABRIC_TYPE": "infiniband"})
    assert proc.returncode == 2 and "fabric type 'infiniband' is not accepted" in proc.stderr
