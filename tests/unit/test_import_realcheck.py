"""The parts of the real-Slurm check (job/importer/realcheck.py) that need no cluster: what
is neutralised in a request, how torchrun command lines are read, and how two recorded
runs are compared. The check itself runs on the testbed in
tests/cluster/test_import_corpus.py."""

from __future__ import annotations

from pathlib import Path

from slurmfabric.job.importer.check import CheckReport
from slurmfabric.job.importer.realcheck import (
    Call,
    JobRun,
    _Norm,
    _torchrun_args,
    compare,
    neutralise,
    relative_programs,
)


def test_neutralise_drops_what_the_testbed_cannot_grant_and_caps_nodes() -> None:
    script = ("#!/bin/bash\n#SBATCH -N 24 --gres=gpu:8 -p train\n#SBATCH --account acct\n"
              "#SBATCH --ntasks-per-node=8 --exclusive\n#SBATCH --err=/fsx/%j.err\n"
              "#SBATCH --array=0-4%2\n#SBATCH --mem=0 # all of it\n"
              "echo hi\n#SBATCH --gres=gpu:1\n")
    out = neutralise(script, 4).split("\n")
    assert out[1] == "#SBATCH --nodes=4"
    assert out[2] == "#"  # --account acct: option and its value
    assert out[3] == "#SBATCH --ntasks-per-node=8 --exclusive"
    assert out[4] == "#"  # --err: sbatch's abbreviation of --error
    assert out[5] == "#SBATCH --array=0"
    assert out[6] == "#"
    # After the first command sbatch reads no #SBATCH line: left as it was.
    assert out[8] == "#SBATCH --gres=gpu:1"


def test_neutralise_keeps_a_node_range_within_the_testbed() -> None:
    assert neutralise("#SBATCH --nodes 2-8\n", 4) == "#SBATCH --nodes=2-4\n"


def test_torchrun_args_drop_the_rendezvous_and_spell_the_worker_as_torchrun_runs_it() -> None:
    original = ["--nnodes", "4", "--nproc_per_node=8", "--rdzv_id", "101",
                "--rdzv_endpoint", "h:29500", "train.py", "--lr", "1"]
    rendered = ["--nnodes=4", "--node-rank=0", "--no-python", "--nproc-per-node=8",
                "slurmfabric", "launch", "--mode", "torchrun", "--", "python", "-u",
                "train.py", "--lr", "1"]
    assert _torchrun_args(original) == _torchrun_args(rendered) == [
        "--nproc-per-node=8", "python", "-u", "train.py", "--lr", "1"]
    assert _torchrun_args(["-m", "pkg.train"])[-3:] == ["-u", "-m", "pkg.train"]


def test_relative_launchers_get_stand_ins_absolute_ones_do_not() -> None:
    text = "srun ./pt_fsdp/bin/torchrun x.py\nsrun /opt/conda/bin/python y.py\n" \
           "env/bin/python z.py\n"
    assert relative_programs(text) == ["./pt_fsdp/bin/torchrun", "env/bin/python"]


def _call(step: str, node: str, argv: list[str], env: dict[str, str], when: int,
          prog: str = "/sb/bin/python") -> Call:
    return Call(step, "0", "0", node, prog, argv, "/jobs/x/work", env, when)


def _run(job: str, calls: list[Call], code: str = "0:0") -> JobRun:
    return JobRun(job_id=job, exit_code=code, state="COMPLETED", calls=calls)


def _norms(a: JobRun, b: JobRun) -> tuple[_Norm, _Norm]:
    return (_Norm(a, Path("/jobs/x/work"), ["n1", "n2"]),
            _Norm(b, Path("/jobs/x/work"), ["n3", "n4"]))


def test_compare_finds_task_layout_argv_env_order_and_exit_differences() -> None:
    env = {"NCCL_DEBUG": "INFO", "LOG": "/logs/17/out"}
    orig = _run("17", [
        _call("batch", "n1", ["module", "purge"], env, 1, prog="/sb/standin"),
        _call("batch", "n1", ["module", "load", "x"], env, 2, prog="/sb/standin"),
        *[_call("0", n, ["train.py"], env, 3 + i) for i, n in enumerate(["n1", "n1", "n2",
                                                                        "n2"])]])
    env2 = {"NCCL_DEBUG": "WARN", "LOG": "/logs/18/out"}  # LOG differs only by the job id
    new = _run("18", [
        _call("batch", "n3", ["module", "load", "x"], env2, 1, prog="/sb/standin"),
        _call("batch", "n3", ["module", "purge"], env2, 2, prog="/sb/standin"),
        *[_call("3", n, ["train.py", "--x"], env2, 3 + i) for i, n in enumerate(["n3",
                                                                                "n4"])]],
        code="1:0")
    report = CheckReport()
    compare(orig, new, _norms(orig, new), report)
    text = "\n".join(report.differences)
    # The order changed: one of the two moved, said on both sides.
    assert "(module load x): runs in the rendered script only" in text
    assert "(module load x): runs in the original only" in text
    assert "2 node(s), tasks per node [2, 2] becomes 2 node(s), tasks per node [1, 1]" in text
    assert "argv ['python', 'train.py'] becomes ['python', 'train.py', '--x']" in text
    assert "env NCCL_DEBUG: 'INFO' becomes 'WARN'" in text
    assert "LOG" not in text
    assert "job exit: COMPLETED 0:0 becomes COMPLETED 1:0" in text


def test_compare_of_the_same_run_on_other_nodes_finds_nothing() -> None:
    env = {"A": "1"}
    orig = _run("5", [_call("0", "n1", ["t.py"], env, 1), _call("0", "n2", ["t.py"], env, 2)])
    new = _run("6", [_call("2", "n3", ["t.py"], env, 1), _call("2", "n4", ["t.py"], env, 2)])
    report = CheckReport()
    compare(orig, new, _norms(orig, new), report)
    assert report.differences == []


# --- containers (containers.sh): the request recorded, the command run here -------------

_CONTAINERS = Path(__file__).resolve().parents[2] / "slurmfabric/job/importer/containers.sh"


def _shell(tmp_path: Path, body: str, env: dict[str, str]) -> tuple[str, list[list[str]]]:
    """Run ``body`` after sourcing containers.sh; its stdout and the requests recorded."""
    import subprocess

    rec = tmp_path / "rec"
    script = f". {_CONTAINERS}\n{body}\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "SF_REC_DIR": str(rec), **env},
                          check=False)
    assert done.returncode == 0, done.stderr
    requests = sorted(Path(f"{rec}.container").iterdir()) if Path(
        f"{rec}.container").exists() else []
    return done.stdout, [p.read_bytes().decode().split("\0")[:-1] for p in requests]


def test_srun_runs_without_the_container_request_which_is_recorded(tmp_path: Path) -> None:
    """pyxis's options (args.c spank_opts) in both spellings, a flag, its environment
    variable and Slurm's own --container leave srun's argv; the program's own words stay
    (its --container-image is an argument, not srun's)."""
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    out, requests = _shell(tmp_path, f'PYXIS_CONTAINER_WORKDIR=/w sf_srun {fake} {bindir} '
                           '-l --container-image nvcr.io#nvidia/pytorch:24.01 '
                           '--container-mounts=/fsx:/fsx --no-container-remap-root --mpi=pmix '
                           '--container=/oci/b echo --container-image=x', {})
    assert out.split("\n")[:-1] == ["-l", "--mpi=pmix", "echo", "--container-image=x"]
    assert requests == [["srun", "--container-image=nvcr.io#nvidia/pytorch:24.01",
                         "--container-mounts=/fsx:/fsx", "--no-container-remap-root",
                         "--container=/oci/b", "PYXIS_CONTAINER_WORKDIR=/w"]]


def test_srun_gives_a_program_the_host_lacks_a_stand_in_of_its_name(tmp_path: Path) -> None:
    """The image's /opt/nccl-tests/build/all_reduce_perf (known name) and /fsx/wrap (after
    '--' of slurmfabric launch) run as stand-ins; an option's value is left alone."""
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    (tmp_path / "standin").write_text("#!/bin/sh\n")
    (tmp_path / "standin").chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "all_reduce_perf").symlink_to(tmp_path / "standin")
    out, _ = _shell(tmp_path, f"sf_srun {fake} {bindir} -o /nope/out.log "
                    "/opt/nccl-tests/build/all_reduce_perf -b 8", {})
    assert out.split("\n")[:-1] == ["-o", "/nope/out.log", f"{bindir}/all_reduce_perf",
                                    "-b", "8"]
    out, _ = _shell(tmp_path, f"sf_srun {fake} {bindir} --mpi=pmix echo launch -- /fsx/wrap a",
                    {})
    assert out.split("\n")[:-1] == ["--mpi=pmix", "echo", "launch", "--",
                                    f"{bindir}.image/wrap", "a"]


def test_apptainer_shifter_enroot_record_the_request_and_run_the_command(
        tmp_path: Path) -> None:
    out, requests = _shell(tmp_path, "(sf_unwrap singularity exec --nv -B /scratch:/s "
                           "--env=A=1 /img/x.sif echo in-image)\n"
                           "(sf_unwrap shifter --image=docker:nersc/pytorch:24 --module=gpu "
                           "echo shifted)\n(sf_unwrap enroot start -m /d:/d pyt echo started)\n"
                           "(sf_unwrap apptainer run /img/x.sif) || echo not-unwrapped", {})
    assert out.split("\n")[:-1] == ["in-image", "shifted", "started", "not-unwrapped"]
    assert requests == [["singularity", "--nv", "-B=/scratch:/s", "--env=A=1", "/img/x.sif"],
                        ["shifter", "--image=docker:nersc/pytorch:24", "--module=gpu"],
                        ["enroot", "-m=/d:/d", "pyt"]]


def test_container_requests_compare_as_text_without_what_slurmfabric_adds(
        tmp_path: Path) -> None:
    from slurmfabric.job.zipapp import CONTAINER_PATH

    orig, new = JobRun(job_id="11"), JobRun(job_id="12")
    orig.containers = [["srun", "--container-image=/a.sqsh", "--container-mounts=/fsx:/fsx"]]
    new.containers = [["srun", "--container-image=/a.sqsh", "--container-name=sf-12",
                       f"--container-mounts=/c/sf.pyz:{CONTAINER_PATH}:ro,/fsx:/fsx",
                       "--container-env=NCCL_DEBUG"]]
    norms = (_Norm(orig, tmp_path / "o", []), _Norm(new, tmp_path / "n", []))
    report = CheckReport()
    compare(orig, new, norms, report)
    assert report.differences == []
    assert any("--container-env=NCCL_DEBUG" in a for a in report.added)
    new.containers = [["srun", "--container-image=/b.sqsh", "--container-mounts=/fsx:/fsx"]]
    report = CheckReport()
    compare(orig, new, norms, report)
    assert report.differences == [
        "container request: srun --container-image=/a.sqsh --container-mounts=/fsx:/fsx "
        "becomes srun --container-image=/b.sqsh --container-mounts=/fsx:/fsx"]


def test_neutralise_drops_every_container_option_of_the_header() -> None:
    script = ("#!/bin/bash\n#SBATCH --container-image=x --container-writable -N 2\n"
              "#SBATCH --container /oci/b\n#SBATCH --no-container-mount-home\n"
              "#SBATCH --image=docker:a --volume=/a:/b\n#SBATCH --environment=edf\n")
    out = neutralise(script, 4).split("\n")
    assert out[1:6] == ["#SBATCH --nodes=2", "#", "#", "#", "#"]
