"""pyxis container jobs: one set of container options for every step, the plan's variables
named in --container-env, the zipapp the image's python3 runs, and launch --print's report
of what the image sets (pyxis semantics: https://github.com/NVIDIA/pyxis/wiki/Usage)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from slurmfabric.config import load_config
from slurmfabric.errors import UsageError
from slurmfabric.job import zipapp
from slurmfabric.job.render import render_sbatch, split_pyxis_args
from slurmfabric.rank import container

IMAGE = "nvcr.io#nvidia/pytorch:25.08-py3"
DEBIAN_PYTHON = "/usr/bin/python3"  # Debian's python3: no slurmfabric in it


def script(*extra: str) -> str:
    sets = ["launcher.type=torchrun", "job.nodes=2", "job.gpus_per_node=8",
            'program.command=["python", "train.py"]', f"program.container_image={IMAGE}",
            'program.container_mounts=["/data:/data:ro"]', "program.env.OMP_NUM_THREADS=4",
            "program.env_prepend.PATH=/opt/tools/bin", "fabric.type=ib",
            "fabric.nccl.NCCL_SOCKET_IFNAME=ib0", "fabric.nccl.NCCL_DEBUG=WARN"]
    return render_sbatch(load_config(sets=[*sets, *extra]))


def srun_lines(text: str) -> list[str]:
    """Each srun command with its continuation lines joined."""
    return [re.sub(r"\s*\\\n\s*", " ", m) for m in re.findall(r"^srun (?:.*\\\n)*.*$", text, re.M)]


def container_words(text: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith("sf_container=("))
    return shlex.split(line[len("sf_container=("):-1])


def test_check_and_launch_steps_use_the_same_container_options() -> None:
    text = script('launcher.srun_args=["--container-workdir", "/work", "--exclusive", '
                  '"--no-container-mount-home"]')
    pyz_check, *steps = srun_lines(text)
    assert len(steps) == 2  # the node check, then the launch
    # first, on the hosts: the zipapp pyxis will mount (no container option there)
    assert '"$sf_pyz_check" sf-check "$sf_pyz" || exit 2' in pyz_check
    assert "--container-" not in pyz_check and "sf_container" not in pyz_check
    for step in steps:
        assert '"${sf_container[@]}"' in step
        # no container option outside the shared array: the check sees the launch's mounts
        assert "--container-" not in step.replace('"${sf_container[@]}"', "")
    words = container_words(text)
    assert words[:2] == [f"--container-image={IMAGE}", "--container-name=sf-$SLURM_JOB_ID"]
    assert "--container-mounts=$sf_pyz:/opt/slurmfabric/slurmfabric.pyz:ro,/data:/data:ro" \
        in words
    assert words[-3:] == ["--container-workdir", "/work", "--no-container-mount-home"]
    assert " --exclusive " in steps[1] and "--exclusive" not in steps[0]
    # ranks run the mounted zipapp with the image's python3
    assert "--no-python python3 /opt/slurmfabric/slurmfabric.pyz launch --mode torchrun" \
        in steps[1]


def test_a_container_name_of_the_user_replaces_the_job_scoped_one() -> None:
    words = container_words(script('launcher.srun_args=["--container-name=mine:exec"]'))
    names = [w for w in words if w.startswith("--container-name")]
    assert names == ["--container-name=mine:exec"]  # pyxis refuses two --container-name


def test_every_variable_the_script_exports_is_named_in_container_env() -> None:
    text = script("launcher.resume.events=[\"worker_fail\"]",
                  "program.env_expand.RUN=${SLURM_JOB_ID}", "program.params.LR=1")
    names = set(re.search(r"^export SLURMFABRIC_CONTAINER_ENV=(\S+)$", text, re.M)
                .group(1).split(","))
    exported = set(re.findall(r"^export ([A-Z_][A-Z0-9_]*)=", text, re.M))
    exported |= set(re.findall(r"^export ([A-Z_][A-Z0-9_]*)$", text, re.M))  # params
    exported.discard("PATH")  # env_prepend: the host's PATH must not replace the image's
    assert exported <= names, exported - names
    # ... and what 'slurmfabric env' prints in the batch shell
    assert {"MASTER_ADDR", "MASTER_PORT", "RDZV_ID", "NNODES", "SLURMFABRIC_ENV_SET",
            "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_NET"} <= names
    assert "PATH" not in names


def test_split_pyxis_args_keeps_values_with_their_options() -> None:
    pyxis, other = split_pyxis_args(["--exclusive", "--container-env", "A,B", "-l",
                                     "--container-remap-root", "--container-save=/x.sqsh"])
    assert pyxis == ["--container-env", "A,B", "--container-remap-root",
                     "--container-save=/x.sqsh"]
    assert other == ["--exclusive", "-l"]


def test_without_a_container_nothing_changes() -> None:
    text = render_sbatch(load_config(sets=["launcher.type=srun", "job.nodes=2",
                                           "job.ntasks_per_node=1",
                                           'program.command=["./app"]']))
    assert "sf_container" not in text and "zipapp" not in text
    assert "SLURMFABRIC_CONTAINER_ENV" not in text


def _snippet(text: str, name: str = "sf_image_check") -> str:
    line = next(x for x in text.splitlines() if x.startswith(f"{name}="))
    return shlex.split(line[len(f"{name}="):])[0]


def _image_check(text: str) -> str:
    return _snippet(text)


def test_a_zipapp_a_node_cannot_see_fails_on_the_host_naming_node_and_fix(
        tmp_path: Path) -> None:
    """The zipapp's directory is not shared with a node: the host-side check says so in one
    line, before pyxis fails the step with its own 'cannot stat source path'."""
    check = _snippet(script(), "sf_pyz_check")
    pyz = tmp_path / "slurmfabric-1.pyz"
    out = subprocess.run(["/bin/sh", "-c", check, "sf-check", str(pyz)],
                         env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "node7"},
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"the slurmfabric zipapp {pyz} is not visible on node7" in out.stderr
    assert "SLURMFABRIC_ZIPAPP_DIR to a directory that every node mounts" in out.stderr
    pyz.write_bytes(b"PK")
    ok = subprocess.run(["/bin/sh", "-c", check, "sf-check", str(pyz)],
                        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert ok.returncode == 0 and not ok.stderr, ok.stderr


def test_an_image_without_python3_fails_the_check_naming_the_image(tmp_path: Path) -> None:
    check = _image_check(script())
    bare = tmp_path / "bin"
    bare.mkdir()  # an image whose PATH has no python3
    out = subprocess.run(["/bin/sh", "-c", check, "sf-check", IMAGE, "/x.pyz"],
                         env={"PATH": str(bare), "SLURMD_NODENAME": "node7"},
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert f"the image {IMAGE} has no python3 on node7" in out.stderr


def test_zipapp_runs_under_a_python_without_slurmfabric(tmp_path: Path) -> None:
    if not os.access(DEBIAN_PYTHON, os.X_OK):
        pytest.fail(f"{DEBIAN_PYTHON} (Debian's python3) is missing; scripts/test.sh installs it")
    bare = subprocess.run([DEBIAN_PYTHON, "-I", "-c", "import slurmfabric"], capture_output=True)
    assert bare.returncode != 0  # so the run below can only use the archive
    pyz = zipapp.ensure(tmp_path)
    assert pyz == zipapp.ensure(tmp_path)  # cached: the second call builds nothing
    check = _image_check(script())
    ok = subprocess.run(["/bin/sh", "-c", check, "sf-check", IMAGE, str(pyz)],
                        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
           "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
           "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "n1",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    out = subprocess.run([DEBIAN_PYTHON, "-I", str(pyz), "launch", "--mode", "srun", "--",
                          "sh", "-c", 'echo "$RANK/$WORLD_SIZE/$LOCAL_RANK"'],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1/4/1"


def test_zipapp_name_follows_the_sources(tmp_path: Path) -> None:
    files = zipapp.sources()
    assert any(name == "slurmfabric/rank/task.py" for name, _ in files)
    assert not any("__pycache__" in name or name.endswith(".pyc") for name, _ in files)
    changed = [(n, d + b"\n") if n.endswith("cli.py") else (n, d) for n, d in files]
    assert zipapp.digest(files) != zipapp.digest(changed)
    names = zipfile.ZipFile(zipapp.ensure(tmp_path)).namelist()
    assert names[0] == "__main__.py" and "slurmfabric/cli.py" in names
    assert "slurmfabric/cli.pyc" in names and "__main__.pyc" not in names


def test_zipapp_bytecode_is_used_and_a_foreign_one_falls_back(tmp_path: Path) -> None:
    """The archive's .pyc spare each rank the compile; a python3 of another version (bad
    magic number) must still run, from the .py beside it."""
    pyz = zipapp.ensure(tmp_path)

    def tried(archive: Path) -> list[str]:  # zipimport's lookups for slurmfabric.cli (-vv)
        out = subprocess.run([sys.executable, "-I", "-B", "-vv", str(archive), "--version"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return re.findall(r"# trying \S+/slurmfabric/(cli\.pyc?)$", out.stderr, re.M)

    assert "cli.pyc" in tried(pyz) and "cli.py" not in tried(pyz)  # bytecode: no compile
    foreign = tmp_path / "foreign.pyz"
    with zipfile.ZipFile(pyz) as src, zipfile.ZipFile(foreign, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith(".pyc"):
                data = b"\x00\x00\r\n" + data[4:]  # another interpreter's magic number
            dst.writestr(info, data)
    assert "cli.py" in tried(foreign)  # the bytecode refused, then the source


def test_zipapp_dir_that_pyxis_cannot_mount_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="pyxis --container-mounts") as error:
        zipapp.ensure(tmp_path / "a,b")
    assert "SLURMFABRIC_ZIPAPP_DIR" in (error.value.hint or "")


def test_image_env_reports_only_what_the_plan_did_not_pass(tmp_path: Path) -> None:
    # enroot's /etc/environment: the image's ENV, one NAME=VALUE per line
    environ_file = tmp_path / "environment"
    environ_file.write_text("PATH=/usr/local/bin:/usr/bin\nNCCL_SOCKET_IFNAME=eth0\n"
                            "NCCL_IB_HCA=mlx5_9\nUCX_TLS=rc\nCUDA_VERSION=12.4\n")
    env = {"SLURMFABRIC_CONTAINER_ENV": "NCCL_SOCKET_IFNAME,MASTER_ADDR",
           "NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_9", "UCX_TLS": "rc",
           "PATH": "/usr/bin", "CUDA_VERSION": "12.4"}
    assert container.image_env(env, str(environ_file)) == {"NCCL_IB_HCA": "mlx5_9",
                                                           "UCX_TLS": "rc"}
    # a value that is no longer the image's (launch already set the plan's) is not its
    assert "UCX_TLS" not in container.image_env({**env, "UCX_TLS": "tcp"}, str(environ_file))
    # the node plan decides NCCL_IB_HCA itself; the user's NCCL_SOCKET_IFNAME stays
    view = container.plan_view(env, str(environ_file))
    assert "NCCL_IB_HCA" not in view and view["NCCL_SOCKET_IFNAME"] == "ib0"
    assert "UCX_TLS" in view
    # outside a container job nothing is read or reported
    del env["SLURMFABRIC_CONTAINER_ENV"]
    assert container.image_env(env, str(environ_file)) == {}


def test_the_per_rank_modules_need_no_third_party_package() -> None:
    # what the zipapp must run with a bare python3: launch, and everything it imports
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import slurmfabric.commands.launch, slurmfabric.rank.container; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'jinja2', 'psutil', 'yaml')]; print(bad)")
    out = subprocess.run([sys.executable, "-I", "-B", "-c", code,
                          str(Path(zipapp.PACKAGE).parent)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_named_container_without_an_image_is_a_container_job() -> None:
    """pyxis runs a step in an existing named container with --container-name alone; its
    ranks run the zipapp too, and the check names that container."""
    text = render_sbatch(load_config(sets=[
        "launcher.type=srun", "job.nodes=2", "job.ntasks_per_node=1", 'program.command=["./app"]',
        'launcher.srun_args=["--container-name", "prepared"]']))
    words = container_words(text)
    assert not any(w.startswith("--container-image") for w in words)
    assert words[-2:] == ["--container-name", "prepared"]
    _, check, launch = srun_lines(text)
    assert check.endswith("sf-check prepared /opt/slurmfabric/slurmfabric.pyz || exit 2")
    assert "python3 /opt/slurmfabric/slurmfabric.pyz launch" in launch


def test_a_step_in_the_jobs_image_reuses_the_jobs_container() -> None:
    """[[steps]] in the job's image run in the job's named container (imported once per
    node, the plan's --container-env); another image, or container options of the step's
    own, keep the step's --container-image."""
    text = script(f'steps=[{{name = "prep", command = ["python3", "prep.py"], '
                  f'container_image = "{IMAGE}"}}, {{name = "other", command = ["probe"], '
                  f'container_image = "other#img"}}, {{name = "own", command = ["probe"], '
                  f'container_image = "{IMAGE}", srun_args = ["--container-mounts=/x:/x"]}}]')
    lines = {name: srun for srun in srun_lines(text)
             for name in ("prep", "other", "own") if f"--job-name={name} " in srun}
    assert '"${sf_container[@]}"' in lines["prep"]
    assert "--container-image" not in lines["prep"].replace('"${sf_container[@]}"', "")
    assert "--container-image='other#img'" in lines["other"]
    assert '"${sf_container[@]}"' not in lines["other"]
    assert f"--container-image='{IMAGE}'" in lines["own"] and "--container-mounts=/x:/x" \
        in lines["own"]
    # the array exists before the step that uses it
    assert text.index("sf_container=(") < text.index("--job-name=prep")
