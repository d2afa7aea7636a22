"""Storage that starves GPUs, on the real testbed (issue 43 item 6): a rendered 2-node x
1-rank srun job (examples/train_input.py: a real DataLoader, gloo on CPU) whose dataset
is slow on its second node only. ``slurmfabric jobs stragglers`` reads the ranks' beats
while the job runs and names the second node input-bound, and not the first, whose rank
waits for it in the all_reduce."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from input_bound import assert_names_input_bound, wait_for_steps
from testbed_cluster import Cluster

from slurmfabric.slurm.hostlist import expand

pytestmark = pytest.mark.cluster


def test_the_node_with_the_slow_dataset_is_named_input_bound(cluster: Cluster,
                                                              tmp_path: Path) -> None:
    beats = tmp_path / "beats"
    args = ["slurmfabric", "submit", "--set", "launcher.type=srun", "--set", "job.nodes=2",
            "--set", "job.ntasks_per_node=1", "--set", "job.name=input-bound", "--set",
            "job.partition=debug", "--set", "fabric.type=tcp", "--set",
            f"job.output={tmp_path}/input-%j.out", "--set",
            'program.command=["python", "examples/train_input.py"]',
            "--set", f"program.env.SLURMFABRIC_PROGRESS_DIR={beats}",
            "--set", "program.env.OMP_NUM_THREADS=1",
            "--set", "program.env.TRAIN_SECONDS=40"]
    job = cluster.run(args).stdout.strip()
    assert job.isdigit(), job
    try:
        if not wait_for_steps(beats, 2, 5, 90):
            out = next(tmp_path.glob("input-*.out"), None)
            pytest.fail(f"no 2 ranks at step 5 in 90 s: {out.read_text()[-2000:] if out else ''}")
        proc = cluster.run(["slurmfabric", "jobs", "stragglers", job, "--progress-dir",
                            str(beats), "--seconds", "8", "--every", "1", "--json"],
                           timeout=60)
        status = json.loads(cluster.run(["slurmfabric", "jobs", "status", job,
                                         "--json"]).stdout)
    finally:
        cluster.run(["slurmfabric", "jobs", "cancel", job], check=False)
    first, second = expand(status["nodes"])
    assert_names_input_bound(proc.stdout, second, first)
