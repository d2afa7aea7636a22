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
from slurmfabric.slurm import cmd
from slurmfabric.slurm import pyslurm as slurm_pyslurm

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

# Submits one config (argv[1]: JSON with path, sets, keys to drop, backend, workdir) the way
# `slurmfabric submit` does (build_request, then the backend), held like `sbatch --hold`
# (priority 0), and prints the job id, or the refusal with exit 2 as the CLI would.
_SUBMIT = """
import json, sys
try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib
from slurmfabric.config import load_config
from slurmfabric.errors import UsageError
from slurmfabric.job.submit import build_request, submit
from slurmfabric.slurm import pyslurm as slurm_pyslurm
spec = json.loads(sys.argv[1])
with open(spec["path"], "rb") as handle:
    table = tomllib.load(handle)
for dotted in spec["drop"]:  # the variant without a refused value
    *parents, last = dotted.split(".")
    section = table
    for name in parents:
        section = section.get(name, {})
    section.pop(last, None)
config = load_config(data=table, sets=spec["sets"])
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
    if job.gpus_per_node:  # torchrun: one task per node, its workers; else 2 tasks per node
        torchrun = load_config(path).launcher.type == "torchrun"
        sets += ["job.gpus_per_node=0",
                 "launcher.nproc_per_node=2" if torchrun else "job.ntasks_per_node=2"]
    if (job.cpus_per_task or 0) > 2:
        sets.append("job.cpus_per_task=2")
    return sets


def _submit(cluster: Cluster, path: Path, sets: list[str], backend: str, work: Path,
            drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    spec = {"path": str(path), "sets": sets, "backend": backend, "workdir": str(work),
            "drop": list(drop)}
    return cluster.run([sys.executable, "-c", _SUBMIT, json.dumps(spec)], check=False,
                       cwd=work, timeout=60)


_OWN_ID = ("StdOut", "StdErr", "StdIn")  # paths whose file name may hold the job id (%j)


def _record(cluster: Cluster, job_id: str) -> dict[str, str]:
    """The job as slurmctld holds it; its own id in its file names (StdOut=...-%j.out) made
    'JOBID' (only in the file name: the directory may hold the same digits)."""
    record = cmd.job(job_id, env=cluster.env)
    for key in _OWN_ID:
        folder, slash, name = record.get(key, "").rpartition("/")
        record[key] = folder + slash + re.sub(rf"(?<!\d){job_id}(?!\d)", "JOBID", name)
    return record


def differences(sbatch: dict[str, str], pyslurm: dict[str, str]) -> dict[str, tuple]:
    return {key: (sbatch.get(key), pyslurm.get(key)) for key in sorted(set(sbatch) | set(pyslurm))
            if key not in NOT_COMPARED and sbatch.get(key) != pyslurm.get(key)}


def _compare(cluster: Cluster, path: Path, sets: list[str], work: Path,
             drop: tuple[str, ...] = ()) -> list[str]:
    """Submit both ways; return the fields compared (asserting none differs)."""
    by_sbatch = _submit(cluster, path, sets, "sbatch", work, drop)
    assert by_sbatch.returncode == 0, by_sbatch.stderr
    by_pyslurm = _submit(cluster, path, sets, "pyslurm", work, drop)
    jobs = [by_sbatch.stdout.strip(), by_pyslurm.stdout.strip()]
    try:
        assert by_pyslurm.returncode == 0, by_pyslurm.stderr
        sbatch, pyslurm = (_record(cluster, job) for job in jobs)
    finally:
        cluster.run(["scancel", *[j for j in jobs if j.isdigit()]], check=False)
    assert differences(sbatch, pyslurm) == {}, f"{path.name} {sets} without {drop}"
    assert sbatch["Priority"] == "0" and "JobHeld" in sbatch["Reason"]  # held, not run
    return sorted(set(sbatch) - set(NOT_COMPARED))


# What a refused value becomes in the compared variant: a memory size in place of 0 (all
# memory); no warning signal (a resume job always carries one: resume off).
_VARIANT = {"job.mem": (["job.mem=1000M"], ()),
            "launcher.signal/launcher.resume": ([], ("launcher.signal", "launcher.resume"))}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_pyslurm_and_sbatch_submit_the_same_job(cluster: Cluster, path: Path,
                                                 tmp_path: Path) -> None:
    """Each example as is; where the installed pyslurm refuses a value (one line naming the
    field, exit 2; docs/launch.md "The pyslurm backend"), that refusal, then the example
    without that value."""
    sets, drop = _testbed_sets(path, cluster), ()
    refusals = []
    for _ in range(len(_VARIANT) + 1):
        tried = _submit(cluster, path, sets, "pyslurm", tmp_path, drop)
        if tried.returncode != 2:
            break
        line = tried.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, tried.stderr
        field = line.split(" = ", 1)[0]
        assert field in _VARIANT and field not in refusals, line
        refusals.append(field)
        sets, drop = sets + _VARIANT[field][0], drop + _VARIANT[field][1]
    assert tried.returncode == 0, tried.stderr
    cluster.run(["scancel", tried.stdout.strip()], check=False)
    if load_config(path).job.mem == "0":  # no release line sends --mem=0 (all memory)
        assert "job.mem" in refusals
    compared = _compare(cluster, path, sets, tmp_path, drop)
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
        else:
            assert refused.returncode == 0, refused.stderr
            cluster.run(["scancel", refused.stdout.strip()], check=False)
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
        # Slurm appends "[user@time]" to the reason
        assert "DRAIN" in state and reason.startswith("slurmfabric: gpu.ecc: GPU3 uncorrected")
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


def test_real_pyslurm_against_another_slurm_is_refused_in_one_line(cluster: Cluster,
                                                                    tmp_path: Path) -> None:
    """The installed (real) pyslurm against a Slurm of another release line (the stand-in
    scontrol on PATH reports it): exit 2, one line naming both versions, nothing submitted,
    pyslurm never imported."""
    version = slurm_pyslurm.installed_version()
    line = slurm_pyslurm.release_line(version or "")
    assert line == cmd.slurm_version(cluster.env)[:2], "build-pyslurm.sh built another"
    other = "22.05.8" if line == (24, 11) else "24.11.1"
    fake_bin = REPO / "tests" / "fixtures" / "pyslurm" / "bin"
    queue = ["squeue", "-h", "-o", "%i"]
    before = cluster.run(queue).stdout
    proc = cluster.run([sys.executable, "-m", "slurmfabric", "submit", "-c",
                        str(REPO / "examples" / "smoke-cpu.toml"), "--backend", "pyslurm"],
                       check=False, cwd=tmp_path, env={
                           "PATH": f"{fake_bin}:{cluster.env['PATH']}",
                           "FAKE_SLURM_VERSION": other})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        f"slurmfabric: error: pyslurm {version} is built for Slurm {line[0]}.{line[1]:02d}, "
        f"but this Slurm is {other} (scontrol --version): their release lines must match")
    assert "Traceback" not in proc.stderr
    assert cluster.run(queue).stdout == before
