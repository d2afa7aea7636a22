"""Site-wide hooks on the real local Slurm testbed: slurm.conf gets TaskProlog= and
CliFilterPlugins=cli_filter/lua (the Debian slurm-wlm plugin), written by
'slurmfabric site install'. A plain hand-written sbatch script with 'srun --label env' must
see the node's plan and its rank in every task; each virtual node's fixture sysfs tree
(tests/fixtures/topology/nodes.py testbed_node: sfn1 InfiniBand, sfn2 RoCE) provides the
plan through the TaskProlog's --sysfs-root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import fakesysfs
import nodes
import pytest
from cleanenv import python_with_prefix
from testbed_cluster import Cluster

pytestmark = pytest.mark.cluster

CPUS = sorted(os.sched_getaffinity(0))
POLICY = """
[cli_filter]
gpu_partitions = ["{gpu}"]
refuse_signals = ["USR1"]
require_gpus = true
[cli_filter.defaults.{cpu}]
requeue = false
[[cli_filter.refuse]]
option = "wrap"
partitions = ["{gpu}"]
message = "write a batch script for GPU jobs"
"""


@pytest.fixture
def site(cluster: Cluster, tmp_path: Path, request) -> Path:
    """Install the hooks into the testbed's slurm.conf for this test; take them out after."""
    roots = tmp_path / "roots"
    for name, layer in zip(cluster.nodes[:2], ("InfiniBand", "Ethernet")):
        fakesysfs.build(nodes.testbed_node(CPUS, layer), roots / name)
    config = tmp_path / "site.toml"
    config.write_text(POLICY.format(gpu=cluster.testbed.s.urgent_partition,
                                    cpu=cluster.partition))
    hooks = tmp_path / "hooks"
    out = cluster.run([sys.executable, "-m", "slurmfabric", "site", "install", str(hooks),
                       "--config", str(config), "--sysfs-root", f"{roots}/{{node}}",
                       "--python", str(python_with_prefix(tmp_path))]).stdout
    conf = [line for line in out.splitlines() if re.match(r"^(TaskProlog|CliFilter)", line)]
    assert conf == [f"TaskProlog={hooks.resolve()}/slurmfabric-taskprolog",
                    "CliFilterPlugins=cli_filter/lua"], out
    lua = cluster.conf_path.parent / "cli_filter.lua"  # read from beside slurm.conf

    def restore() -> None:
        cluster.set_extra_conf("")
        lua.unlink(missing_ok=True)

    request.addfinalizer(restore)
    lua.write_text((hooks / "cli_filter.lua").read_text())
    cluster.set_extra_conf("\n".join(conf) + "\n")
    return tmp_path


def tasks(output: str) -> dict[int, dict[str, str]]:
    """'srun --label env' output -> task id -> its environment."""
    found: dict[int, dict[str, str]] = {}
    for line in output.splitlines():
        m = re.match(r"^\s*(\d+): ([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if m:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
    return found


def test_a_plain_sbatch_script_gets_the_plan_in_every_task(cluster: Cluster, site: Path):
    a, b = cluster.nodes[:2]
    out_dir = site / "out"
    out_dir.mkdir()
    script = f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 -w {a},{b} -t 5
export TMPDIR={site}/tmp
mkdir -p "$TMPDIR"
export SLURMFABRIC_PLAN_CACHE={site}/plancache
export NCCL_SOCKET_IFNAME=user0
srun --label env > {out_dir}/plain.txt
SLURMFABRIC_TASKPROLOG=off srun --label env > {out_dir}/off.txt
"""
    job = cluster.sbatch_wait(script, "-o", str(out_dir / "job.txt"), timeout=120)
    assert job.state == "COMPLETED", (out_dir / "job.txt").read_text()
    plain = tasks((out_dir / "plain.txt").read_text())
    assert sorted(plain) == [0, 1, 2, 3]
    shown = {}
    for rank, env in plain.items():
        node, local = env["SLURMD_NODENAME"], int(env["SLURM_LOCALID"])
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == \
            (str(rank), str(local), "4"), env
        assert env["MASTER_ADDR"] == a and env["NNODES"] == "2", env
        assert env["NCCL_SOCKET_IFNAME"] == "user0"  # the user's export wins
        assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1", env  # not storage mlx5_2
        assert env["SLURMFABRIC_NIC"] == f"mlx5_{local}:1", env
        if node == b:  # RoCE: the IPv4-mapped RoCE v2 GID of the fixture's table
            assert env["NCCL_IB_GID_INDEX"] == "3", env
        else:
            assert "NCCL_IB_GID_INDEX" not in env, env
        shown[rank] = {k: v for k, v in sorted(env.items())
                       if k.startswith(("NCCL_", "MASTER_", "RANK", "LOCAL_", "WORLD_",
                                        "SLURMFABRIC_GPU", "SLURMFABRIC_NIC"))}
    print("srun env, what each task received:")  # for the issue note (pytest -s)
    for rank, env in shown.items():
        print(f"  task {rank}: " + " ".join(f"{k}={v}" for k, v in env.items()))
    # the per-boot plan cache (rank/plancache.py): one discovery and one plan per node (each
    # virtual node has its own root), not one per task
    assert len(list((site / "plancache").glob("topology-*.marshal"))) == 2
    assert len(list((site / "plancache").glob("plan-*.marshal"))) == 2
    off = tasks((out_dir / "off.txt").read_text())
    assert sorted(off) == [0, 1, 2, 3]
    for env in off.values():
        assert "NCCL_IB_HCA" not in env and "RANK" not in env, env


def test_a_broken_taskprolog_interpreter_never_stops_a_task(cluster: Cluster, site: Path):
    """slurmstepd ends a task whose TaskProlog exits non-zero, so a broken install would stop
    every job on the cluster. The installed script's interpreter is removed, then replaced by a
    real Python without slurmfabric (Debian's /usr/bin/python3): every task of a 2-node job
    still runs, without the plan, and the job completes."""
    a, b = cluster.nodes[:2]
    interpreter = site / "python-with-pycache-prefix"  # what the fixture installed
    assert interpreter.exists()
    for case in ("removed", "no-slurmfabric"):
        if case == "removed":
            interpreter.unlink()
        else:
            interpreter.write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
            interpreter.chmod(0o755)
            assert subprocess.run(["/usr/bin/python3", "-I", "-c", "import slurmfabric"],
                                  capture_output=True).returncode != 0
        out = site / f"broken-{case}"
        out.mkdir()
        script = f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 -w {a},{b} -t 5
set -euo pipefail
srun --label env > {out}/env.txt
echo finished
"""
        job = cluster.sbatch_wait(script, "-o", str(out / "job.txt"), timeout=120)
        assert job.state == "COMPLETED", (case, (out / "job.txt").read_text())
        assert "finished" in (out / "job.txt").read_text()
        ran = tasks((out / "env.txt").read_text())
        assert sorted(ran) == [0, 1, 2, 3], case
        for env in ran.values():  # no plan, and nothing half-made
            assert "NCCL_IB_HCA" not in env and "RANK" not in env, env


def test_the_cli_filter_refuses_applies_defaults_and_fails_open(cluster: Cluster,
                                                                 site: Path) -> None:
    gpu = cluster.testbed.s.urgent_partition

    def sbatch(*args: str) -> subprocess.CompletedProcess:
        return cluster.run(["sbatch", "--parsable", "-t", "1", *args], check=False)

    script = site / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    refused = sbatch("-p", gpu, "--signal=B:USR1@60", "--gpus-per-node=1", str(script))
    assert refused.returncode != 0
    # Slurm 22.05 hands the filter "B:USR1" (the default @60 left out)
    assert "--signal=B:USR1 is refused on GPU partition" in refused.stderr, refused.stderr
    no_gpus = sbatch("-p", gpu, str(script))
    assert no_gpus.returncode != 0
    assert f"partition {gpu} is for GPU jobs: ask for GPUs" in no_gpus.stderr
    wrap = sbatch("-p", gpu, "--gpus-per-node=1", "--wrap", "true")
    assert wrap.returncode != 0 and "write a batch script for GPU jobs" in wrap.stderr
    # The CPU partition's default: --no-requeue unless the user says otherwise.
    default = sbatch("-p", cluster.partition, "--hold", str(script))
    user = sbatch("-p", cluster.partition, "--hold", "--requeue", str(script))
    try:
        assert default.returncode == 0, default.stderr
        assert "default --no-requeue" in default.stderr
        assert "Requeue=0" in cluster.run(["scontrol", "show", "job", default.stdout.strip()]
                                          ).stdout
        assert "Requeue=1" in cluster.run(["scontrol", "show", "job", user.stdout.strip()]
                                          ).stdout
    finally:
        cluster.run(["scancel", default.stdout.strip(), user.stdout.strip()], check=False)
    # A broken policy table (a hand edit) still lets jobs submit, and says so.
    lua = cluster.conf_path.parent / "cli_filter.lua"
    lua.write_text(re.sub(r"^local POLICY = .*$", "local POLICY = {refuse = 7}",
                          lua.read_text(), flags=re.M))
    broken = sbatch("-p", gpu, "--signal=USR1@60", "--hold", str(script))
    assert broken.returncode == 0, broken.stderr
    cluster.run(["scancel", broken.stdout.strip()], check=False)
    assert "filter error, submission allowed" in broken.stderr
