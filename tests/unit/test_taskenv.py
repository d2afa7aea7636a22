"""slurmfabric.rank.task: the per-task build as a Python API (what env prints, launch applies)."""

from __future__ import annotations

import os
from pathlib import Path

import fakesysfs
import nodes
import pytest

from slurmfabric.errors import RankEnvError
from slurmfabric.rank import task as taskenv

HERE = Path(__file__).resolve().parents[1]

STEP = {"SLURM_JOB_ID": "41", "SLURM_CLUSTER_NAME": "c", "SLURM_JOB_NODELIST": "gpu[1-2]",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[1-2]",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "16",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_PROCID": "13", "SLURM_LOCALID": "5",
        "SLURM_NODEID": "1", "SLURMD_NODENAME": "gpu2", "SLURMFABRIC_ALLOW_LOOPBACK": "1",
        # the test session's scratch plan cache (tests/conftest.py), not the default one
        "SLURMFABRIC_PLAN_CACHE": os.environ["SLURMFABRIC_PLAN_CACHE"]}


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(fakesysfs.build(nodes.h100_ib(), tmp_path_factory.mktemp("h100")))


def test_build_gives_rank_plan_and_binding(h100: str) -> None:
    task = taskenv.build({**STEP, "SLURMFABRIC_SYSFS_ROOT": h100}, fabric_type="ib")
    assert (task.rank_env.rank, task.rank_env.local_rank) == (13, 5)
    assert task.variables["NCCL_IB_HCA"].startswith("=mlx5_0:1,")
    assert task.variables["SLURMFABRIC_NIC"] == "mlx5_7:1"  # GPU 5's PIX rail
    assert task.binding.gpu.index == 5 and task.binding.mem_node == 1
    unbound = taskenv.build({**STEP, "SLURMFABRIC_SYSFS_ROOT": h100}, bind=False)
    assert "SLURMFABRIC_CPUS" not in unbound.variables and unbound.binding is not None


def test_strict_refuses_a_fabric_the_node_lacks(h100: str) -> None:
    with pytest.raises(RankEnvError, match="fabric.type=roce but node gpu2 has no usable RoCE"):
        taskenv.build({**STEP, "SLURMFABRIC_SYSFS_ROOT": h100}, fabric_type="roce")
    shown = taskenv.build({**STEP, "SLURMFABRIC_SYSFS_ROOT": h100}, fabric_type="roce",
                          strict=False)
    assert shown.plan.errors and "NCCL_IB_HCA" not in shown.variables
