"""Rendering: #SBATCH lines, header provenance, per-launcher launch lines, quoting guard,
run-time (not render-time) per-node values, and shellcheck on every rendered script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

import slurmfabric
from slurmfabric.config import LAUNCHERS, load_config
from slurmfabric.errors import ConfigError
from slurmfabric.job.render import (
    config_digest,
    config_from_script,
    environment,
    login_only_path,
    render_env_block,
    render_launch,
    render_sbatch,
    template_dirs,
)

REPO = Path(__file__).resolve().parents[2]
SF = "/opt/slurm fabric/bin/slurmfabric"  # a path with a space: must stay one word


@pytest.fixture(autouse=True)
def _clean_env(clean_sf_env: None) -> None:
    """Every test here starts from a clean SLURMFABRIC_* environment."""


def config_for(launcher: str, *extra: str):
    sets = [f"launcher.type={launcher}", "job.nodes=2", "job.gpus_per_node=4",
            "job.partition=debug", f"launcher.slurmfabric={SF}"]
    if launcher != "nccl-tests":
        sets.append('program.command=["python", "train.py", "--lr", "3e-4"]')
    return load_config(sets=[*sets, *extra])


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_render_sbatch_is_the_public_lazy_export() -> None:
    config = config_for("srun")
    assert slurmfabric.render_sbatch(config) == render_sbatch(config)


def test_sbatch_lines_sorted_and_complete() -> None:
    config = config_for("srun", "job.time=1:00:00", "job.exclusive=true", "job.requeue=false",
                        "launcher.signal=USR1", 'job.extra_sbatch=["--gres=nvme:1"]')
    lines = sbatch_lines(render_sbatch(config))
    modelled = lines[:-1]
    assert modelled == sorted(modelled)
    assert set(modelled) == {
        "#SBATCH --exclusive", "#SBATCH --gpus-per-node=4", "#SBATCH --job-name=slurmfabric",
        "#SBATCH --no-requeue", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
        "#SBATCH --partition=debug", "#SBATCH --signal=USR1@120", "#SBATCH --time=1:00:00",
    }
    assert lines[-1] == "#SBATCH --gres=nvme:1"


def test_header_provenance() -> None:
    config = config_for("srun")
    script = render_sbatch(config, rerender="slurmfabric render -c /x/job.toml")
    assert script.startswith("#!/bin/bash\n")
    assert f"slurmfabric {slurmfabric.__version__} from config {config_digest(config)}" in script
    assert "# Re-render: slurmfabric render -c /x/job.toml\n" in script
    assert "set -euo pipefail\n" in script
    assert config_from_script(script) == config
    # a different config gets a different digest
    assert config_digest(config_for("srun", "job.nodes=3")) != config_digest(config)


def test_header_comment_cannot_break_out_of_its_line() -> None:
    script = render_sbatch(config_for("srun"), rerender="x\nrm -rf /")
    assert "# Re-render: x\\nrm -rf /\n" in script
    assert "\nrm -rf /" not in script


def test_torchrun_one_task_per_node_one_worker_per_gpu() -> None:
    script = render_sbatch(config_for("torchrun"))
    assert "#SBATCH --ntasks-per-node=1" in sbatch_lines(script)
    launch = render_launch(config_for("torchrun"))
    assert launch.startswith('srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 ')
    assert "--nproc-per-node=4" in launch
    assert '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"' in launch
    assert "--no-python" in launch
    assert f"'{SF}' launch --mode torchrun -- python train.py --lr 3e-4" in launch


@pytest.mark.parametrize("node_id", ["0", "1"])
def test_torchrun_store_host_is_decided_on_each_node(node_id: str, tmp_path: Path) -> None:
    """Only the step's node 0 hosts the rendezvous store, decided in the task at run time."""
    for name, body in {"srun": 'while [ "${1#-}" != "$1" ]; do shift; done; exec "$@"',
                       "torchrun": 'printf "%s\\n" "$@"'}.items():
        (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    launch = render_launch(config_for("torchrun", f"launcher.torchrun={tmp_path / 'torchrun'}"))
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_NNODES": "2", "SLURM_JOB_ID": "9",
           "MASTER_ADDR": "n1-ib", "MASTER_PORT": "29501", "RDZV_ID": "sf-9",
           "SLURM_NODEID": node_id}
    argv = subprocess.run(["bash", "-c", launch], env=env, capture_output=True, text=True,
                          check=True).stdout.splitlines()
    assert argv[0] == f"--rdzv-conf=is_host={1 if node_id == '0' else 0}"
    assert "--rdzv-endpoint=n1-ib:29501" in argv and "--rdzv-id=sf-9" in argv
    assert argv[-9:] == [SF, "launch", "--mode", "torchrun", "--", "python", "train.py",
                         "--lr", "3e-4"]


@pytest.mark.parametrize(("launcher", "prefix"), [
    # each step names its own counts (issue 31): a generator's header may not
    ("srun", 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=4 --kill-on-bad-exit=1'),
    ("srun-pmix", 'srun --mpi=pmix --nodes="$SLURM_NNODES" --ntasks-per-node=4 '
     '--kill-on-bad-exit=1'),
    ("nccl-tests", 'srun --mpi=pmix --nodes="$SLURM_NNODES" --ntasks-per-node=4 '
     '--kill-on-bad-exit=1'),
])
def test_srun_launchers_wrap_each_task(launcher: str, prefix: str) -> None:
    launch = render_launch(config_for(launcher))
    assert launch.startswith(prefix)
    assert f"'{SF}' launch --mode srun -- " in launch
    assert "#SBATCH --ntasks-per-node=4" in render_sbatch(config_for(launcher))


def test_nccl_tests_sweep_one_step_per_op() -> None:
    config = load_config(REPO / "examples" / "nccl-tests-sweep.toml")
    launch = render_launch(config, slurmfabric_bin="slurmfabric")
    steps = [line for line in launch.splitlines() if line.startswith("srun ")]
    assert len(steps) == 4
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        assert f"/opt/nccl-tests/build/{op}_perf --minbytes 8 --maxbytes 8G" in launch


def test_mpirun_rank_count_and_mapping() -> None:
    launch = render_launch(config_for("mpirun", 'launcher.mpirun_args=["--mca", "btl", "^openib"]'))
    # every rank goes through launch --mode mpi, which binds it; so mpirun binds nothing
    # the rank count comes from the allocation at run time (sbatch -N overrides job.nodes)
    assert launch.startswith('mpirun_bin=mpirun\nexec -- "$mpirun_bin" -np "$((SLURM_NNODES * 4))" '
                             "--map-by ppr:4:node --bind-to none "
                             "--mca btl '^openib' \\\n")
    assert " launch --mode mpi -- python train.py" in launch
    own = render_launch(config_for("mpirun", 'launcher.mpirun_args=["--bind-to", "core"]'))
    assert "--bind-to none" not in own and "--bind-to core" in own
    assert launch.rstrip().endswith("python train.py --lr 3e-4")


def test_srun_cpus_per_task_and_container() -> None:
    launch = render_launch(config_for(
        "srun", "job.cpus_per_task=16", "program.container_image=nvcr.io#nvidia/pytorch:24.05",
        'program.container_mounts=["/data:/data", "/home/a b:/h"]'))
    assert "--cpus-per-task=16" in launch  # srun 22.05 does not inherit it
    # the container options live in the env block's sf_container (tests/unit/test_containers.py)
    assert '"${sf_container[@]}"' in launch and "--container-" not in launch


def test_env_block_is_run_time_not_render_time() -> None:
    config = config_for("torchrun", "program.env.TOKEN=a b", "fabric.nccl.NCCL_DEBUG=INFO",
                        "program.workdir=/scratch/my run")
    block = render_env_block(config)
    assert "export TOKEN='a b'\n" in block
    assert "export NCCL_DEBUG=INFO\n" in block
    assert "cd -- '/scratch/my run'\n" in block
    assert f"sf_bin='{SF}'\n" in block
    assert ('slurmfabric_job_env="$(exec -- "$sf_bin" env)" || exit $?\n'
            'eval "$slurmfabric_job_env"') in block
    script = render_sbatch(config)
    # nothing about the login node is frozen into the script
    import socket

    assert socket.gethostname() not in script.replace("slurmfabric", "")
    for frozen in ("MASTER_ADDR=", "NODE_RANK=", "$SLURM_NODEID", "NCCL_IB_HCA", "NCCL_SOCKET"):
        assert frozen not in script


@pytest.mark.parametrize(("fabric", "expected"), [
    ("ib", {"NCCL_NET": "IB"}), ("roce", {"NCCL_NET": "IB"}), ("tcp", {"NCCL_IB_DISABLE": "1"}),
    ("efa", {"FI_PROVIDER": "efa"}), ("auto", {}),
])
def test_fabric_type_exports(fabric: str, expected: dict) -> None:
    block = render_env_block(config_for("srun", f"fabric.type={fabric}"))
    exported = {line[7:].split("=")[0]: line.split("=", 1)[1] for line in block.splitlines()
                if line.startswith(("export NCCL_", "export FI_"))}
    assert exported == expected


def test_explicit_nccl_overrides_win_over_fabric_type() -> None:
    block = render_env_block(config_for("srun", "fabric.type=ib", "fabric.nccl.NCCL_NET=IBext"))
    assert "export NCCL_NET=IBext\n" in block and "NCCL_NET=IB\n" not in block


@pytest.mark.parametrize(("fabric", "nccl", "field"), [
    ("tcp", "NCCL_NET=IB", "fabric.nccl.NCCL_NET"),
    ("tcp", "NCCL_IB_HCA==mlx5_0", "fabric.nccl.NCCL_IB_HCA"),
    ("tcp", "NCCL_IB_DISABLE=0", "fabric.nccl.NCCL_IB_DISABLE"),
    ("ib", "NCCL_NET=Socket", "fabric.nccl.NCCL_NET"),
    ("roce", "NCCL_IB_DISABLE=1", "fabric.nccl.NCCL_IB_DISABLE"),
    ("efa", "NCCL_IB_HCA=mlx5", "fabric.nccl.NCCL_IB_HCA"),
    ("efa", "NCCL_NET=IB", "fabric.nccl.NCCL_NET"),
])
def test_contradicting_nccl_settings_are_refused_at_render(fabric: str, nccl: str,
                                                            field: str) -> None:
    with pytest.raises(ConfigError) as error:
        config_for("srun", f"fabric.type={fabric}", f"fabric.nccl.{nccl}")
    assert any(line.startswith(field + ":") and f"fabric.type is {fabric}" in line
               for line in error.value.problems), error.value.problems


def test_user_exports_come_before_the_job_env_and_the_launch() -> None:
    script = render_sbatch(config_for("srun", "program.env.MASTER_PORT=31000"))
    assert script.index("export MASTER_PORT=31000") < script.index("env)\"") \
        < script.index("launch --mode srun")


def test_templates_refuse_unquoted_values() -> None:
    env = environment()
    with pytest.raises(jinja2.TemplateError, match="without a quoting filter"):
        env.from_string("echo {{ value }}").render(value="$(touch /tmp/pwned)")
    assert env.from_string("echo {{ value | q }} {{ n }}").render(
        value="$(x)", n=3) == "echo '$(x)' 3"
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing | q }}").render()


def test_template_dirs_prefer_the_package() -> None:
    dirs = template_dirs()
    assert dirs and dirs[-1] == REPO / "templates"
    for launcher in LAUNCHERS:
        assert (REPO / "templates" / "launch" / f"{launcher}.sh.j2").is_file()


SHELLCHECK = shutil.which("shellcheck")


def rendered_scripts() -> dict[str, str]:
    scripts = {f"launcher-{name}": render_sbatch(config_for(name, "program.modules=[\"cuda\"]",
                                                            "launcher.signal=USR1",
                                                            "program.env.A=$HOME 'x'"))
               for name in LAUNCHERS}
    for example in sorted((REPO / "examples").glob("*.toml")):
        scripts[example.stem] = render_sbatch(load_config(example))
    return scripts


@pytest.mark.parametrize("name", sorted(rendered_scripts()))
def test_shellcheck_clean(name: str, tmp_path: Path) -> None:
    assert SHELLCHECK, "shellcheck is missing: apt-get install shellcheck"
    path = tmp_path / f"{name}.sh"
    path.write_text(rendered_scripts()[name])
    proc = subprocess.run([SHELLCHECK, "--shell=bash", "--severity=style", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bash_syntax_of_every_script(tmp_path: Path) -> None:
    for name, text in rendered_scripts().items():
        path = tmp_path / f"{name}.sh"
        path.write_text(text)
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, (name, proc.stderr)


def test_the_script_uses_the_nodes_slurmfabric_unless_asked(tmp_path) -> None:
    script = render_sbatch(load_config(sets=["launcher.type=srun", "job.ntasks_per_node=1",
                                             'program.command=["true"]']))
    assert "sf_bin=slurmfabric\n" in script and sys.executable not in script
    assert 'bash -c "$sf_check" sf-check "$sf_bin"' in script
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfabric", "render", "--embed-bin", "--set",
         "launcher.type=srun", "--set", "job.ntasks_per_node=1", "--set",
         'program.command=["true"]'], capture_output=True, text=True, cwd=tmp_path,
        env={**os.environ, "SLURMFABRIC_SITE_DEFAULTS": ""})
    assert proc.returncode == 0, proc.stderr
    embedded = str(Path(sys.executable).parent / "slurmfabric")
    assert f"sf_bin={embedded}\n" in proc.stdout
    # Wherever this venv lives: warned about exactly when the path looks login-node-only.
    why = login_only_path(embedded)
    if why:
        assert proc.stderr.startswith(f"slurmfabric: warning: the script runs {embedded} on "
                                      f"every node, but {why}"), proc.stderr
    else:
        assert "warning" not in proc.stderr, proc.stderr


def test_a_path_inside_a_clone_or_home_is_login_node_only(tmp_path, monkeypatch) -> None:
    clone = tmp_path / "src" / "proj"
    (clone / ".git").mkdir(parents=True)
    (clone / ".venv" / "bin").mkdir(parents=True)
    assert login_only_path(str(clone / ".venv" / "bin" / "slurmfabric")) == \
        f"it lies in the clone {clone}"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "bin").mkdir(parents=True)
    assert "home" in (login_only_path(str(tmp_path / "home" / "bin" / "slurmfabric")) or "")
    assert login_only_path(str(tmp_path / "opt" / "slurmfabric")) is None
    assert login_only_path("slurmfabric") is None


@pytest.mark.parametrize("field", ["launcher.slurmfabric", "launcher.torchrun",
                                   "launcher.mpirun", "launcher.slurmfabric_module"])
def test_helper_programs_are_not_options(field: str) -> None:
    with pytest.raises(ConfigError) as error:
        config_for("srun", f"{field}=--help")
    assert any(line.startswith(f"{field}: ") and "not starting with '-'" in line
               for line in error.value.problems), error.value.problems


def test_nccl_tests_mpi_plugin_and_gpus_per_rank() -> None:
    launch = render_launch(config_for("nccl-tests", "launcher.nccl_tests.mpi=pmi2",
                                      "launcher.nccl_tests.gpus_per_rank=2"))
    assert launch.startswith("srun --mpi=pmi2 ") and " --ngpus 2 " in launch
    script = render_sbatch(config_for("nccl-tests", "launcher.nccl_tests.gpus_per_rank=2"))
    assert "#SBATCH --ntasks-per-node=2\n" in script  # 4 GPUs per node, 2 per rank
    with pytest.raises(ConfigError, match="gpus_per_rank: 3 does not divide"):
        config_for("nccl-tests", "launcher.nccl_tests.gpus_per_rank=3")


def test_relative_workdir_is_written_as_a_path_not_a_cd_special() -> None:
    """'cd -- -' is 'cd "$OLDPWD"' and a relative operand is searched in CDPATH (bash
    manual, cd): a relative workdir gets './', an absolute or dotted one stays as it is."""
    from slurmfabric.job.render import path_word

    assert path_word("-") == "./-"
    assert path_word("~") == "'./~'"
    assert path_word("wd") == "./wd"
    assert path_word("/scratch/run") == "/scratch/run"
    assert path_word("../run") == "../run"
    assert path_word("..x") == "./..x"
    block = render_env_block(config_for("srun", "program.workdir=-"))
    assert "cd -- ./-\n" in block


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_command_names_run_as_programs(launcher: str) -> None:
    """A name starting with '%' in command position is bash's 'fg' ("Job Control Basics");
    exec runs the program of that name instead, and never a builtin."""
    script = render_sbatch(config_for(launcher, "launcher.slurmfabric=%sf",
                                      "launcher.mpirun=%mpirun"))
    assert 'slurmfabric_job_env="$(exec -- "$sf_bin" env)" || exit $?\n' in script
    assert "sf_check='type -P -- \"$1\"" in script
    if launcher == "mpirun":
        assert 'mpirun_bin=%mpirun\nexec -- "$mpirun_bin" -np ' in script
    raw = script.splitlines()
    commands = [line.strip() for before, line in zip(["", *raw], raw)
                if not before.endswith("\\")]  # a continuation line holds arguments
    assert not any(line.startswith(("%", '"$sf_bin"', '"$mpirun_bin"')) for line in commands)


@pytest.mark.parametrize("value", ["-x", "--help", "", "a\nb"])
def test_slurmfabric_bin_override_is_checked(value: str) -> None:
    from slurmfabric.errors import UsageError
    from slurmfabric.job.render import node_bin

    with pytest.raises(UsageError, match="--slurmfabric-bin"):
        node_bin(config_for("srun"), value)
