"""Storage that starves GPUs, on the real testbed (issue 43 item 6): a rendered 2-node x
1-rank srun job (examples/train_input.py: a real DataLoader, gloo on CPU) whose dataset
is slow on its second node only. ``slurmfabric jobs stragglers`` reads the ranks' beats
while the job runs and names the second node input-bound, and not the first, whose rank
waits for it in the all_reduce."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from testbed_cluster import Cluster

from slurmfabric.progress.watch import read_beats
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
        deadline = time.time() + 90
        while time.time() < deadline:
            seen = read_beats(str(beats))
            if len(seen) == 2 and min(b.step for b in seen.values()) >= 5:
                break
            time.sleep(1)
        else:
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
    report = json.loads(proc.stdout)
    nodes = report["nodes"]
    print("data share per node:", json.dumps(nodes, sort_keys=True))  # the figure (-s)
    assert nodes[second]["input_bound"] and not nodes[first]["input_bound"], report
    assert nodes[second]["data_share"] >= 0.5 and nodes[first]["data_share"] <= 0.15
    inputs = [f for f in report["findings"] if f["kind"] == "input"]
    assert len(inputs) == 1 and inputs[0]["detail"].startswith(
        f"input-bound node(s) {second}: their ranks wait for their next batch")
    assert [r["host"] for r in inputs[0]["ranks"]] == [second]
