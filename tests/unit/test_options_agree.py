"""One job, three outputs: every examples/*.toml (and variants that set every row of the
options table) rendered as the sbatch script, as pyslurm JobSubmitDescription fields and as
each Kubernetes manifest its launcher fits must describe the same job: nodes, tasks and
workers per node, requeue, the warning signal, open mode, time, partition and the rest.

The expected correspondence below is written from the two upstream documents, not read from
slurmfabric/job/options.py: sbatch(1) (https://slurm.schedmd.com/sbatch.html) and the
JobSubmitDescription docstrings of pyslurm 25.11.2 (pyslurm/core/job/submission.pxd: "This
is the same as --X from sbatch"; --gpus-per-node goes to gres_per_node, as they advise).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from slurmfabric.config import load_config
from slurmfabric.errors import UsageError
from slurmfabric.job import k8s, options
from slurmfabric.job.render import render_sbatch
from slurmfabric.job.submit import pyslurm_fields

PYSLURM = "25.11.2"  # the release line whose JobSubmitDescription names the table uses

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.toml"))

SBATCH_TO_PYSLURM = {
    "job-name": "name", "nodes": "nodes", "ntasks-per-node": "ntasks_per_node",
    "gpus-per-node": "gres_per_node", "partition": "partitions", "account": "account",
    "qos": "qos", "time": "time_limit", "mem": "memory_per_node",
    "cpus-per-task": "cpus_per_task", "constraint": "constraints",
    "reservation": "reservations", "output": "standard_output", "error": "standard_error",
    "array": "array", "dependency": "dependencies", "mail-type": "mail_types",
    "mail-user": "mail_user", "exclusive": "resource_sharing", "requeue": "is_requeueable",
    "signal": "signal", "open-mode": "log_files_open_mode",
    # issue 31: Slurm's other request forms and common options
    "gres": "gres_per_node", "gpus-per-task": "gpus_per_task", "cpus-per-gpu": "cpus_per_gpu",
    "mem-per-cpu": "memory_per_cpu", "mem-per-gpu": "memory_per_gpu",
    "wait-all-nodes": "wait_all_nodes", "ntasks-per-core": "ntasks_per_core",
    "exclude": "excluded_nodes", "nodelist": "required_nodes", "distribution": "distribution",
    "hint": None,  # JobSubmitDescription has no hint: the pyslurm backend refuses it
}

EVERY_ROW = ["job.account=ml", "job.qos=high", "job.mem=0", "job.constraint=h100",
             "job.reservation=maint", "job.error=err-%j.txt", "job.array=0-3",
             "job.dependency=afterok:12", "job.mail_type=END,FAIL",
             "job.mail_user=a@example.org", "job.exclusive=true"]
# (example, extra --set values): every example as it is, then variants for the rows and
# launchers the examples leave out.
CASES = [(path.name, []) for path in EXAMPLES] + [
    ("smoke-cpu.toml", EVERY_ROW),
    ("smoke-cpu.toml", ["job.requeue=false", "launcher.signal=TERM",
                        "launcher.signal_seconds=30"]),
    ("resume-cpu.toml", ["launcher.resume.mode=chain",
                         'launcher.resume.events=["timeout"]']),
    ("resume-cpu.toml", ['launcher.resume.events=["preempt"]', "launcher.resume.mode=chain"]),
    ("h100-fsdp.toml", ["launcher.type=srun", "launcher.signal=USR2"]),
    ("h100-fsdp.toml", ["launcher.type=mpirun", "job.gpus_per_node=4"]),
    ("h100-fsdp.toml", ["launcher.type=srun-pmix", "job.gpus_per_node=0",
                        "job.ntasks_per_node=3"]),
    ("nccl-tests-sweep.toml", ["job.gpu_request=gres", "job.gpu_type=h100",
                               "job.mem_per_gpu=80gb", "job.wait_all_nodes=true",
                               "job.exclude=gpu[001-002]", "job.nodelist=gpu[003-004]",
                               "job.distribution=block:cyclic"]),
    ("nccl-tests-sweep.toml", ["job.gpu_request=gpus-per-task", "job.gpus_per_task=1",
                               "job.mem_per_cpu=4G", "job.ntasks_per_core=1"]),
    ("h100-fsdp.toml", ["job.gpu_request=none"]),
]


def sbatch_lines(script: str) -> dict[str, object]:
    """``#SBATCH --key=value`` -> {key: value}; a bare flag -> True, ``--no-x`` -> x: False."""
    out: dict[str, object] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, eq, value = line[len("#SBATCH --"):].partition("=")
            if not eq and key.startswith("no-"):
                out[key[3:]] = False
            else:
                out[key] = value if eq else True
    return out


def same(sbatch_key: str, sbatch_value: object, field: object) -> bool:
    """Does the sbatch value mean what the pyslurm field means?"""
    if sbatch_key == "gpus-per-node":
        return field == f"gpu:{sbatch_value}"
    if sbatch_key == "gres":  # the same gres text (gpu[:type]:count)
        return field == sbatch_value
    if sbatch_key == "wait-all-nodes":  # --wait-all-nodes=0|1
        return str(int(bool(field))) == sbatch_value
    if sbatch_key == "exclusive":
        return sbatch_value is True and field == "exclusive"
    if sbatch_key == "requeue":
        return sbatch_value is field
    if sbatch_key == "signal":  # pyslurm resolves names through signal.Signals: SIG prefix
        flags, colon, rest = str(sbatch_value).rpartition(":")
        return field == f"{flags}{colon}SIG{rest}"
    return str(sbatch_value) == str(field)


def script_workers(script: str, opts: dict[str, object]) -> int:
    """Ranks per node as the script starts them."""
    match = re.search(r"--nproc-per-node=(\d+)", script)
    return int(match.group(1)) if match else int(str(opts["ntasks-per-node"]))


def k8s_shape(manifest: dict) -> tuple[int, int]:
    """(nodes, workers per node) as each operator reads its manifest."""
    spec = manifest["spec"]
    kind = manifest["kind"]
    if kind == "PyTorchJob":
        replicas = spec["pytorchReplicaSpecs"]
        nodes = sum(r["replicas"] for r in replicas.values())
        return nodes, int(spec["nprocPerNode"])
    if kind == "TrainJob":
        return spec["trainer"]["numNodes"], spec["trainer"]["numProcPerNode"]
    if kind == "JobSet":
        job = spec["replicatedJobs"][0]["template"]["spec"]
        env = {e["name"]: e["value"] for e in job["template"]["spec"]["containers"][0]["env"]}
        assert int(env["NNODES"]) == job["parallelism"]
        return job["parallelism"], int(env["NPROC_PER_NODE"])
    workers = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    command = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "command"]
    runs = [shlex.split(line) for line in command[2].splitlines()] \
        if command[:2] == ["/bin/sh", "-ec"] else [command]  # one mpirun per nccl-tests op
    for run in runs:
        assert int(run[run.index("-np") + 1]) == workers * spec["slotsPerWorker"]
    return workers, spec["slotsPerWorker"]


def without_slurm_only(config):
    """The config less the fields a Kubernetes target refuses (job/k8s.py,
    _refuse_unhonoured): none of them changes the job's shape."""
    job = config.job.model_copy(update={"nodelist": None, "exclude": None, "constraint": None,
                                        "gpu_type": None, "array": None, "dependency": None,
                                        "extra_sbatch": []})
    launcher = config.launcher.model_copy(update={
        "slurmfabric_module": None, "srun_args": [],
        "resume": config.launcher.resume.model_copy(update={"events": []})})
    return config.model_copy(update={"job": job, "launcher": launcher,
                                     "program": config.program.model_copy(
                                         update={"modules": []})})


SEEN_ROWS: set[str] = set()


@pytest.mark.parametrize(("example", "sets"), CASES,
                         ids=[f"{name}{'+' + str(i) if sets else ''}"
                              for i, (name, sets) in enumerate(CASES)])
def test_sbatch_pyslurm_and_kubernetes_describe_the_same_job(example, sets) -> None:
    config = load_config(str(REPO / "examples" / example), sets, "")
    if config.job.mem == "0":  # refused by the pyslurm backend (test_submit.py): a size here
        config = load_config(str(REPO / "examples" / example), [*sets, "job.mem=1000M"], "")
    script = render_sbatch(config)
    opts = sbatch_lines(script)
    fields = pyslurm_fields(config, "/submit/dir", version=PYSLURM)
    assert fields.pop("working_directory") == "/submit/dir"
    # every #SBATCH line has its pyslurm field, with the same meaning, and nothing more
    assert {SBATCH_TO_PYSLURM[k] for k in opts} == set(fields)
    for key, value in opts.items():
        assert same(key, value, fields[SBATCH_TO_PYSLURM[key]]), (key, value, fields)
    SEEN_ROWS.update(opts)

    nodes, workers = int(str(opts["nodes"])), script_workers(script, opts)
    k8s_config = without_slurm_only(load_config(str(REPO / "examples" / example),
                                                [*sets, "kubernetes.image=img"], ""))
    for target in k8s.TARGETS:
        if config.launcher.type in ("mpirun", "srun-pmix", "nccl-tests") \
                and target != "mpijob":  # MPI ranks: only an MPIJob starts them
            with pytest.raises(UsageError, match="starts MPI ranks") as caught:
                k8s.build(k8s_config, target)
            assert "--target mpijob" in str(caught.value.hint)
            continue
        assert k8s_shape(k8s.build(k8s_config, target)) == (nodes, workers), target


def test_hint_has_no_pyslurm_field_and_is_refused_there_not_dropped() -> None:
    config = load_config(str(REPO / "examples" / "h100-fsdp.toml"),
                         ["job.hint=nomultithread"], "")
    assert sbatch_lines(render_sbatch(config))["hint"] == "nomultithread"
    SEEN_ROWS.add("hint")
    with pytest.raises(UsageError, match="job.hint cannot be passed through the pyslurm"):
        pyslurm_fields(config, "/w", version=PYSLURM)


def test_resume_cpu_is_resumable_through_pyslurm_too() -> None:
    """Issue 30 (a): the pyslurm backend used to drop these three."""
    config = load_config(str(REPO / "examples" / "resume-cpu.toml"), [], "")
    opts = sbatch_lines(render_sbatch(config))
    fields = pyslurm_fields(config, "/w", version=PYSLURM)
    assert (opts["requeue"], opts["signal"], opts["open-mode"]) == (True, "B:USR2@60",
                                                                    "append")
    assert (fields["is_requeueable"], fields["signal"], fields["log_files_open_mode"]) == (
        True, "B:SIGUSR2@60", "append")


def test_smoke_cpu_pytorchjob_runs_the_scripts_two_workers() -> None:
    """Issue 30 (b): nprocPerNode was "1" (max(gpus, 1)) where the script runs 2."""
    config = load_config(str(REPO / "examples" / "smoke-cpu.toml"), ["kubernetes.image=i"],
                         "")
    assert "--nproc-per-node=2 " in render_sbatch(config)
    assert k8s.build(config, "pytorchjob")["spec"]["nprocPerNode"] == "2"


def test_cpus_per_gpu_row() -> None:
    config = load_config(sets=["launcher.type=srun", "job.gpus_per_node=4",
                               'program.command=["x"]', "job.cpus_per_gpu=16"],
                         site_defaults="")
    opts = sbatch_lines(render_sbatch(config))
    fields = pyslurm_fields(config, "/w", version=PYSLURM)
    assert opts["cpus-per-gpu"] == "16" and fields["cpus_per_gpu"] == 16
    assert opts["gpus-per-node"] == "4" and "cpus-per-task" not in opts
    SEEN_ROWS.add("cpus-per-gpu")


def test_every_row_of_the_table_was_compared() -> None:
    """Runs after the cases above (file order): a row no case sets is a row untested."""
    assert {o.sbatch for o in options.OPTIONS} - SEEN_ROWS == set()
    assert set(SBATCH_TO_PYSLURM) == {o.sbatch for o in options.OPTIONS}
    assert all(SBATCH_TO_PYSLURM[o.sbatch] == o.pyslurm for o in options.OPTIONS)

