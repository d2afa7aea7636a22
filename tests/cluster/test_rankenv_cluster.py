"""On the real testbed: every task of a job prints ``slurmfabric env --format json``.

The testbed's nodes are virtual nodes of one host (same ``hostname``), so a task's node is
SLURMD_NODENAME. Each node name resolves (/etc/hosts) to its own loopback address, which
is why SLURMFABRIC_ALLOW_LOOPBACK is not needed: the plain policy keeps the node *name*.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
from testbed_cluster import Cluster

from slurmfabric.slurm import hostlist

pytestmark = pytest.mark.cluster

SLURMFABRIC = Path(sys.executable).parent / "slurmfabric"
SCRIPT = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks=3 --distribution=block --time=2
srun --label bash -c 'echo "SF $SLURMD_NODENAME $({SLURMFABRIC} env --format json | tr -d "\\n")"'
"""


def task_records(output: str) -> list[tuple[str, dict[str, str]]]:
    records = []
    for line in output.splitlines():
        _, _, rest = line.partition(": ")
        if rest.startswith("SF "):
            _, node, payload = rest.split(" ", 2)
            records.append((node, json.loads(payload)))
    return records


def test_every_task_gets_a_consistent_rank_env(cluster: Cluster):
    result = cluster.sbatch_wait(SCRIPT, "--partition", cluster.partition)
    assert result.state == "COMPLETED", result.output
    records = task_records(result.output)
    assert len(records) == 3, result.output
    ranks = sorted(int(env["RANK"]) for _, env in records)
    assert ranks == [0, 1, 2]
    nodes_in_order = sorted({(int(env["NODE_RANK"]), node) for node, env in records})
    step_nodes = [node for _, node in nodes_in_order]
    assert len(step_nodes) == 2
    for node, env in records:
        assert step_nodes[int(env["NODE_RANK"])] == node  # NODE_RANK agrees with the node
        on_node = [e for n, e in records if n == node]
        assert int(env["LOCAL_WORLD_SIZE"]) == len(on_node)
        assert sorted(int(e["LOCAL_RANK"]) for e in on_node) == list(range(len(on_node)))
        assert env["WORLD_SIZE"] == "3" and env["NNODES"] == "2"
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for _, e in records}) == 1
    master = records[0][1]["MASTER_ADDR"]
    assert master == step_nodes[0]
    assert socket.gethostbyname(master) == socket.gethostbyname(step_nodes[0])
    assert hostlist.first(",".join(step_nodes)) == master


@pytest.mark.parametrize("collide", [False, True], ids=["hashed", "forced-collision"])
def test_two_jobs_at_once_on_the_same_nodes_get_different_ports(cluster: Cluster, tmp_path,
                                                                collide: bool):
    """Two jobs that provably run at the same time on the same two nodes.

    Each job takes one CPU per node (the nodes have 4; CR_Core lets jobs share a node),
    stamps its start, then waits (up to 60 s) until the other job has started too: a file
    barrier. If the scheduler ran them one after the other, the first would time out
    without seeing the second and the overlap check below fails. With ``collide`` both
    jobs start from the same port (SLURMFABRIC_PORT, as a hash collision would): the batch
    shell that comes second must see the first job's reservation and take the next port.
    """
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    forced = (f"export SLURMFABRIC_PORT=23456 SLURMFABRIC_PORT_RANGE=23456-23466 "
              f"SLURMFABRIC_PORT_DIR={tmp_path / 'ports'}") if collide else ""
    script = f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --time=3
tag=$1 other=$2 dir={barrier}
{forced}
eval "$({SLURMFABRIC} env)"
date +%s.%N > "$dir/$tag.start"
echo "JOB $SLURM_JOB_NODELIST $MASTER_ADDR $MASTER_PORT"
for _ in $(seq 600); do [ -e "$dir/$other.start" ] && break; sleep 0.1; done
if [ -e "$dir/$other.start" ]; then echo SAW_OTHER; else echo NO_OTHER; fi
sleep 1
date +%s.%N > "$dir/$tag.end"
"""
    nodes = ",".join(cluster.nodes[:2])
    jobs = {
        tag: cluster.submit(
            script.replace("$1", tag).replace("$2", other),
            "--partition", cluster.partition, "--nodelist", nodes,
        )
        for tag, other in (("a", "b"), ("b", "a"))
    }  # fmt: skip
    outputs = {}
    for tag, job_id in jobs.items():
        assert cluster.wait(job_id, timeout=180) == "COMPLETED"
        text = Path(cluster.job(job_id)["StdOut"]).read_text()
        outputs[tag] = text
    for tag, text in outputs.items():
        assert "SAW_OTHER" in text, f"job {tag} never saw the other one start:\n{text}"

    def stamp(name: str) -> float:
        return float((barrier / name).read_text())

    (start_a, end_a), (start_b, end_b) = (
        (stamp(f"{t}.start"), stamp(f"{t}.end")) for t in ("a", "b")
    )
    assert start_a < end_b and start_b < end_a, "the two jobs did not overlap in time"
    (_, list_a, addr_a, port_a), (_, list_b, addr_b, port_b) = (
        next(line.split() for line in outputs[t].splitlines() if line.startswith("JOB"))
        for t in ("a", "b")
    )
    assert list_a == list_b and hostlist.expand(list_a) == cluster.nodes[:2]
    assert addr_a == addr_b == cluster.nodes[0]
    assert port_a != port_b
    if collide:  # deterministic: the first batch shell keeps 23456, the second moves on
        assert {port_a, port_b} == {"23456", "23457"}
