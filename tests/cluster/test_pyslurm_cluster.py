"""Real pyslurm (built by scripts/build-pyslurm.sh for the testbed's Slurm) against sbatch:
every example config is submitted both ways, held (priority 0, as ``sbatch --hold``), and
slurmctld's record of the two jobs (``scontrol show -o job``) must agree field by field,
but for the fields listed in NOT_COMPARED, each with its reason. A config the installed
pyslurm cannot send as sbatch does is refused in one line naming the field; its variant
without that value is compared instead. Drain and resume go through the real pyslurm too."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testbed_cluster import Cluster

from slurmfabric.config import load_config
from slurmfabric.slurm import cmd as slurmcmd

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.toml"))

# Fields of `scontrol show job` that differ between any two jobs, whoever submitted them.
NOT_COMPARED = {
    "JobId": "each job has its own id",
    "ArrayJobId": "the job id again (set on every job in 24.11)",
    "SubmitTime": "when each was submitted",
    "EligibleTime": "derived from the submit time",
    "AccrueTime": "derived from the submit time",
    "StartTime": "the scheduler's estimate for a pending job, per job",
    "EndTime": "StartTime plus the time limit",
    "LastSchedEval": "when the scheduler last looked at each job",
    "Deadline": "unset (N/A) for both; per job when set",
}

# Submits one config (argv[1]: JSON with path, sets, backend, workdir) the way `slurmfabric
# submit` does (build_request, then the backend), held like `sbatch --hold` (priority 0),
# and prints the job id, or the refusal with exit 2 as the CLI would.
_SUBMIT = """
import json, sys
from slurmfabric.config import load_config
from slurmfabric.errors import UsageError
from slurmfabric.job.submit import build_request, submit
from slurmfabric.slurm import pyslurm as slurm_pyslurm
spec = json.loads(sys.argv[1])
config = load_config(spec["path"], sets=spec["sets"])
try:
    if spec["backend"] == "sbatch":
        request = build_request(config, sbatch_args=["--hold"], workdir=spec["workdir"])
        print(submit(request))
    else:
        request = build_request(config, backend="pyslurm", workdir=spec["workdir"])
        print(slurm_pyslurm.submit({**request.pyslurm_fields, "priority": 0}, request.script))
except UsageError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


def _testbed_sets(path: Path, cluster: Cluster) -> list[str]:
    """What the testbed lacks, changed alike for both paths: it has no GPUs (no gres), one
    'debug' partition of 4 nodes with 4 CPUs each. Accounts and QOS are not enforced
    (no AccountingStorageEnforce), so h100-fsdp's account and QOS reach slurmctld as is."""
    job = load_config(path).job
    sets = []
    if job.partition and job.partition != cluster.partition:
        sets.append(f"job.partition={cluster.partition}")
    if job.nodes > len(cluster.nodes):
        sets.append(f"job.nodes={len(cluster.nodes)}")
    if job.gpus_per_node:
        sets += ["job.gpus_per_node=0", "job.ntasks_per_node=2"]
    if (job.cpus_per_task or 0) > 2:
        sets.append("job.cpus_per_task=2")
    return sets


def _submit(cluster: Cluster, path: Path, sets: list[str], backend: str,
            work: Path) -> subprocess.CompletedProcess:
    spec = {"path": str(path), "sets": sets, "backend": backend, "workdir": str(work)}
    return cluster.run([sys.executable, "-c", _SUBMIT, json.dumps(spec)], check=False,
                       cwd=work, timeout=60)


def _record(cluster: Cluster, job_id: str) -> dict[str, str]:
    """The job as slurmctld holds it; its own id in any value (StdOut=...-%j) made 'JOBID'."""
    record = slurmcmd.job(job_id, env=cluster.env)
    return {key: re.sub(rf"\b{job_id}\b", "JOBID", value) for key, value in record.items()}


def differences(sbatch: dict[str, str], pyslurm: dict[str, str]) -> dict[str, tuple]:
    return {key: (sbatch.get(key), pyslurm.get(key)) for key in sorted(set(sbatch) | set(pyslurm))
            if key not in NOT_COMPARED and sbatch.get(key) != pyslurm.get(key)}


def _compare(cluster: Cluster, path: Path, sets: list[str], work: Path) -> list[str]:
    """Submit both ways; return the fields compared (asserting none differs)."""
    by_sbatch = _submit(cluster, path, sets, "sbatch", work)
    assert by_sbatch.returncode == 0, by_sbatch.stderr
    by_pyslurm = _submit(cluster, path, sets, "pyslurm", work)
    jobs = [by_sbatch.stdout.strip(), by_pyslurm.stdout.strip()]
    try:
        assert by_pyslurm.returncode == 0, by_pyslurm.stderr
        sbatch, pyslurm = (_record(cluster, job) for job in jobs)
    finally:
        cluster.run(["scancel", *[j for j in jobs if j.isdigit()]], check=False)
    assert differences(sbatch, pyslurm) == {}, f"{path.name} {sets}"
    assert sbatch["Priority"] == "0" and "JobHeld" in sbatch["Reason"]  # held, not run
    return sorted(set(sbatch) - set(NOT_COMPARED))


# What a refused value becomes in the compared variant: a memory size in place of 0 (all
# memory); no warning signal (a resume job always carries one: resume off).
_VARIANT = {"job.mem": ["job.mem=1000M"],
            "launcher.signal/launcher.resume": ["launcher.signal=", "launcher.resume.events=[]"]}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_pyslurm_and_sbatch_submit_the_same_job(cluster: Cluster, path: Path,
                                                 tmp_path: Path) -> None:
    """Each example as is; where the installed pyslurm refuses a value (one line naming the
    field, exit 2; docs/launch.md "The pyslurm backend"), that refusal, then the example
    without that value."""
    sets = _testbed_sets(path, cluster)
    refusals = []
    for _ in range(len(_VARIANT) + 1):
        tried = _submit(cluster, path, sets, "pyslurm", tmp_path)
        if tried.returncode != 2:
            break
        line = tried.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, tried.stderr
        field = line.split(" = ", 1)[0]
        assert field in _VARIANT and field not in refusals, line
        refusals.append(field)
        sets = sets + _VARIANT[field]
    assert tried.returncode == 0, tried.stderr
    cluster.run(["scancel", tried.stdout.strip()], check=False)
    if load_config(path).job.mem == "0":  # no release line sends --mem=0 (all memory)
        assert "job.mem" in refusals
    compared = _compare(cluster, path, sets, tmp_path)
    print(f"{path.name}: refused {refusals or 'nothing'}; {len(compared)} fields equal: "
          f"{' '.join(compared)}")


def test_requeue_dependency_memory_and_exclusive_reach_slurmctld_alike(
        cluster: Cluster, tmp_path: Path) -> None:
    """The values the examples leave at Slurm's default on this testbed, set explicitly."""
    first = _submit(cluster, EXAMPLES[0], _testbed_sets(EXAMPLES[0], cluster), "sbatch",
                    tmp_path)
    assert first.returncode == 0, first.stderr
    sets = [*_testbed_sets(REPO / "examples" / "smoke-cpu.toml", cluster),
            "job.requeue=true", "job.exclusive=true", "job.mem=1500M", "job.time=1-02:03:00",
            f"job.dependency=afterok:{first.stdout.strip()}", "job.error=err-%j-%x.txt",
            "job.wait_all_nodes=true", "launcher.signal=USR1", "launcher.signal_seconds=90"]
    try:
        refused = _submit(cluster, REPO / "examples" / "smoke-cpu.toml", sets, "pyslurm",
                          tmp_path)
        if refused.returncode == 2:  # pyslurm 22.5.x: no warning signal
            assert refused.stderr.startswith("launcher.signal/launcher.resume = 'USR1@90': ")
            sets = sets[:-2]
        _compare(cluster, REPO / "examples" / "smoke-cpu.toml", sets, tmp_path)
    finally:
        cluster.run(["scancel", first.stdout.strip()], check=False)


def test_drain_and_resume_through_real_pyslurm(cluster: Cluster, tmp_path: Path) -> None:
    """The health drain backend 'pyslurm' on the real module: our reason set, then cleared."""
    node = cluster.nodes[-1]
    script = f"""
import sys
from slurmfabric.health import drain
policy = drain.DrainPolicy(backend="pyslurm", state_dir={str(tmp_path)!r})
print(drain.drain({node!r}, "gpu.ecc", "GPU3 uncorrected", policy).outcome)
"""
    try:
        out = cluster.run([sys.executable, "-c", script], timeout=60)
        assert out.stdout.strip() == "drained", out.stderr
        state, reason = cluster.node_state(node)
        assert "DRAIN" in state and reason == "slurmfabric: gpu.ecc: GPU3 uncorrected"
        resumed = cluster.run([sys.executable, "-c", script.replace(
            "print(drain.drain(", "print(drain.resume_if_ours(").replace(
            ', "gpu.ecc", "GPU3 uncorrected", policy).outcome', ", policy)")], timeout=60)
        assert resumed.stdout.strip() == "True", resumed.stderr
        deadline = time.time() + 30
        while "DRAIN" in cluster.node_state(node)[0]:
            assert time.time() < deadline
            time.sleep(0.5)
    finally:
        cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
