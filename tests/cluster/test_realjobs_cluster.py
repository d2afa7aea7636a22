"""Real jobs on the testbed (issue 31): what real multi-node scripts do beyond the launch.

Each job runs the srun or mpirun launcher with a tiny probe (no torch: the point is the
script's structure, not the collective) and every rank prints one JSON record of what it
sees from inside itself.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from test_launch_e2e import build_mpi_probe
from testbed_cluster import Cluster

pytestmark = pytest.mark.cluster

TIMEOUT = 180
PROBE = (
    "import json, os, socket; print(json.dumps({'probe': 1, "
    "'rank': int(os.environ['RANK']), 'node': os.environ.get('SLURMD_NODENAME'), "
    "'env': {k: os.environ.get(k) for k in ('LD_LIBRARY_PATH', 'SF_SETUP', 'SF_TASK_SETUP', "
    "'WORLD_SIZE', 'SF_PARAM', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'NODE_RANK', "
    "'MASTER_ADDR')}, 'argv': __import__('sys').argv[1:]}), flush=True)"
)


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def probe_records(output: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r'\{"probe": 1[^\n]*\}', output)]


def submit(cluster: Cluster, tmp_path: Path, args: list[str], env: dict | None = None,
           extra: list[str] | None = None) -> tuple[str, str]:
    """`slurmfabric submit` through the CLI; (job id, the job's output)."""
    proc = cluster.run(["slurmfabric", "submit", *args, "--workdir", str(tmp_path),
                        "--set", f"job.output={tmp_path}/job-%j.out", *(extra or [])],
                       check=False, env=env or {})
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    state = cluster.wait(job_id, timeout=TIMEOUT)
    output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{output}"
    return job_id, output


def base_sets(cluster: Cluster, nodes: int = 2, per_node: int = 2) -> list[str]:
    return sets("launcher.type=srun", f"job.nodes={nodes}", f"job.ntasks_per_node={per_node}",
                f"job.partition={cluster.partition}", "job.time=5", "fabric.type=tcp",
                "launcher.check_nodes=false",
                f"program.command=[{json.dumps(sys.executable)}, \"-c\", {json.dumps(PROBE)}]")


def test_prepended_library_path_reaches_every_rank(cluster: Cluster, tmp_path: Path) -> None:
    """program.env_prepend keeps the submitter's LD_LIBRARY_PATH behind the new entry in every
    rank: the value a quoted `/opt/x/lib:$LD_LIBRARY_PATH` would have replaced."""
    args = [*base_sets(cluster), *sets("program.env_prepend.LD_LIBRARY_PATH=/opt/sf-efa/lib")]
    _, output = submit(cluster, tmp_path, args, env={"LD_LIBRARY_PATH": "/sf/base/lib"})
    records = probe_records(output)
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], output
    assert len({r["node"] for r in records}) == 2, output
    assert {r["env"]["LD_LIBRARY_PATH"] for r in records} == {"/opt/sf-efa/lib:/sf/base/lib"}


def test_setup_teardown_steps_params_and_args(cluster: Cluster, tmp_path: Path) -> None:
    """One job with every code field and run-time input: setup exports into the batch shell
    (every rank inherits it), task_setup runs inside each task, a before-step runs once per
    node and an after-step once, teardown runs after the launch, a --param overrides its
    default and the arguments after `--` reach the program as "$@"."""
    marker = tmp_path / "teardown.txt"
    step = ("import os; print('STEP-%s' % os.environ['SF_WHEN'], "
            "os.environ['SLURMD_NODENAME'], flush=True)")
    # [[steps]] as a TOML file: argv as data (a JSON string is a valid TOML string)
    config = tmp_path / "steps.toml"
    config.write_text("".join(
        f'[[steps]]\nname = "{name}"\n{extra}'
        f'command = {json.dumps([sys.executable, "-c", step])}\n'
        f'srun_args = ["--export=ALL,SF_WHEN={name}"]\n\n'
        for name, extra in (("before", ""), ("after", 'when = "after"\nnodes = 1\n'))))
    args = [*base_sets(cluster), *sets(
        'program.setup=["export SF_SETUP=\\"setup-$SLURM_JOB_ID\\""]',
        'program.task_setup=["export SF_TASK_SETUP=task-$SLURM_PROCID"]',
        f'program.teardown=["echo done-$SLURM_JOB_ID > {marker}"]',
        "program.params.SF_PARAM=default-value", "program.pass_args=true",
        f"program.command=[{json.dumps(sys.executable)}, \"-c\", {json.dumps(PROBE)}, "
        "\"p=${SF_PARAM}\"]",
    ), "-c", str(config)]
    job_id, output = submit(cluster, tmp_path, [*args, "--param", "SF_PARAM=from submit"],
                            extra=["--", "--resume", "ckpt dir/"])
    records = probe_records(output)
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], output
    for r in records:
        assert r["env"]["SF_SETUP"] == f"setup-{job_id}", output
        assert r["env"]["SF_TASK_SETUP"] == f"task-{r['rank']}", output
        assert r["env"]["SF_PARAM"] == "from submit", output
        assert r["argv"] == ["p=from submit", "--resume", "ckpt dir/"], output
    before = re.findall(r"^STEP-before (\S+)$", output, re.M)
    after = re.findall(r"^STEP-after (\S+)$", output, re.M)
    assert sorted(before) == sorted({r["node"] for r in records}), output
    assert len(after) == 1, output
    lines = output.splitlines()
    first_rank = min(i for i, line in enumerate(lines) if '"probe": 1' in line)
    assert max(i for i, line in enumerate(lines) if line.startswith("STEP-before")) < first_rank
    assert lines.index(f"STEP-after {after[0]}") > first_rank
    assert marker.read_text().strip() == f"done-{job_id}"


def test_het_job_components_see_one_world(cluster: Cluster, tmp_path: Path) -> None:
    """A heterogeneous job ([job]: 1 node x 2 tasks, [[job.components]]: 1 node x 1 task)
    launches one srun --het-group=0-1 step in which every rank sees one world of 3: ranks
    0..2 over two nodes, local ranks per node, one master (component 0's node). The node
    check runs once per component (https://slurm.schedmd.com/heterogeneous_jobs.html)."""
    component = f'[{{nodes = 1, ntasks_per_node = 1, partition = "{cluster.partition}"}}]'
    args = [*base_sets(cluster, nodes=1, per_node=2),
            *sets(f"job.components={component}", "launcher.check_nodes=true")]
    _, output = submit(cluster, tmp_path, args)
    records = probe_records(output)
    assert sorted(r["rank"] for r in records) == [0, 1, 2], output
    assert {r["env"]["WORLD_SIZE"] for r in records} == {"3"}, output
    by_rank = {r["rank"]: r for r in records}
    first, second = by_rank[0]["node"], by_rank[2]["node"]
    assert first != second and by_rank[1]["node"] == first, output  # component 0: ranks 0, 1
    assert [by_rank[n]["env"]["LOCAL_RANK"] for n in range(3)] == ["0", "1", "0"], output
    assert [by_rank[n]["env"]["LOCAL_WORLD_SIZE"] for n in range(3)] == ["2", "2", "1"]
    assert [by_rank[n]["env"]["NODE_RANK"] for n in range(3)] == ["0", "0", "1"], output
    assert {r["env"]["MASTER_ADDR"] for r in records} == {first}, output


@pytest.fixture(scope="module")
def mpi_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mpi_probe(tmp_path_factory.mktemp("mpi"))


def test_mpirun_script_grows_with_sbatch_N(cluster: Cluster, tmp_path: Path,
                                          mpi_binary: Path) -> None:
    """A script rendered for 1 node and submitted with `sbatch -N2` (the advice real scripts
    give) runs one rank per task slot on both nodes: -np comes from the allocation."""
    script = tmp_path / "job.sbatch"
    proc = cluster.run(["slurmfabric", "render", *sets(
        "launcher.type=mpirun", "job.nodes=1", "job.ntasks_per_node=2",
        f"job.partition={cluster.partition}", "job.time=5", "fabric.type=tcp",
        "launcher.check_nodes=false", "program.env.OMPI_MCA_btl=self,tcp",
        "program.env.OMPI_MCA_btl_tcp_if_include=lo",  # as test_launch_e2e.mpi_sets says
        "program.env.OMPI_ALLOW_RUN_AS_ROOT=1", "program.env.OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
        f"program.command=[{json.dumps(str(mpi_binary))}]"), "-o", str(script)], check=False)
    assert proc.returncode == 0, proc.stderr
    job = cluster.run(["sbatch", "--parsable", "-N", "2", f"--output={tmp_path}/job-%j.out",
                       str(script)], cwd=tmp_path)
    job_id = job.stdout.strip().split(";")[0]
    state = cluster.wait(job_id, timeout=TIMEOUT)
    output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
    assert state == "COMPLETED", f"job {job_id} ended {state}:\n{output}"
    records = [json.loads(m) for m in re.findall(r'\{"rank": [^{}]*\}', output)]
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], output
    assert {r["world_size"] for r in records} == {4}, output
    assert len({r["node"] for r in records}) == 2, output
