"""The Python API as existing sbatch generators use it (issue 31, part 8): they write their
own header and shell lines and splice slurmfabric's blocks in between.

The generator below follows the shape public sbatch generators share: a template with the
site's own ``#SBATCH`` lines (nodes, GPUs, partition; no task count), its own ``echo`` and
``${VAR}`` lines, and the user's blocks pasted in verbatim. The host script is then run by
bash among recording stubs (srun, module, slurmfabric), as Slurm would run it on the first
node.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cleanenv import clean_env

import slurmfabric
from slurmfabric import cli
from slurmfabric.config import JobConfig, load_config
from slurmfabric.errors import ConfigError

SRUN_CONFIG = {
    "job": {"nodes": 2, "gpus_per_node": 8, "partition": "gpu"},
    "launcher": {"type": "srun", "slurmfabric": "slurmfabric"},
    "program": {"command": ["python", "train.py"], "modules": ["cuda/12.4"],
                "env": {"OMP_NUM_THREADS": "4"}},
}

STUBS = {
    "srun": 'printf "%s\\n" "$*" >> "$REC/srun"',
    "module": 'printf "%s\\n" "$*" >> "$REC/module"',
    # `slurmfabric env` prints the job-level exports the real one computes on the node
    "slurmfabric": ('if [ "$1" = env ]; then echo "export MASTER_ADDR=n1 MASTER_PORT=29500 '
                    'RDZV_ID=7"; exit 0; fi; printf "%s\\n" "$*" >> "$REC/slurmfabric"'),
}


def generate(config: JobConfig, *, nounset: bool = False) -> str:
    """A host script as a generator builds it: its own header, its own lines, our blocks."""
    return "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=generated",
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=8",  # the site's header: no --ntasks-per-node
        "#SBATCH --partition=gpu",
        *(["set -u"] if nounset else []),
        'echo "generator: start on ${SLURM_JOB_NODELIST:-?}"',
        slurmfabric.render_env_block(config),
        # the generator's own optional knobs: fine without nounset, fatal with it
        'echo "generator: extra=${GENERATOR_EXTRA_ARGS}"',
        'case $- in *u*) echo "generator: nounset on" ;; *) echo "generator: nounset off" ;; '
        'esac',
        'case $- in *e*) echo "generator: errexit on" ;; *) echo "generator: errexit off" ;; '
        'esac',
        slurmfabric.render_launch(config),
        'echo "generator: done ${GENERATOR_EPILOGUE}"',
        "",
    ])


def run_host(tmp_path: Path, script: str, *, with_sf: bool = True) -> subprocess.CompletedProcess:
    stubs, rec = tmp_path / "stubs", tmp_path / "rec"
    stubs.mkdir(exist_ok=True)
    rec.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        if name == "slurmfabric" and not with_sf:
            continue
        (stubs / name).write_text(f"#!/bin/bash\n{body}\n")
        (stubs / name).chmod(0o755)
    path = tmp_path / "host.sh"
    path.write_text(script)
    env = {**clean_env(), "PATH": f"{stubs}:/usr/bin:/bin", "REC": str(rec),
           "SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURMD_NODENAME": "n1"}
    for name in ("GENERATOR_EXTRA_ARGS", "GENERATOR_EPILOGUE"):
        env.pop(name, None)
    return subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_spliced_blocks_leave_the_host_shell_options_and_start_every_rank(tmp_path) -> None:
    config = JobConfig.from_dict(SRUN_CONFIG)
    proc = run_host(tmp_path, generate(config))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    # modules ran, and nounset (turned off around them) did not leak into the host script
    assert (tmp_path / "rec" / "module").read_text() == "load cuda/12.4\n"
    assert "generator: extra=" in out and "generator: nounset off" in out
    assert "generator: errexit off" in out and "generator: done " in out
    # the launch names its own counts: 8 tasks on each of 2 nodes without the header's help
    check, launch = (tmp_path / "rec" / "srun").read_text().splitlines()
    assert "sf-check" in check  # slurmfabric checked on every node first
    assert launch.startswith("--nodes=2 --ntasks-per-node=8 ")
    assert launch.endswith(" slurmfabric launch --mode srun -- python train.py")


def test_a_host_with_nounset_keeps_it(tmp_path) -> None:
    config = JobConfig.from_dict(SRUN_CONFIG)
    proc = run_host(tmp_path, generate(config, nounset=True))
    # the host's own unset knob is fatal under its own nounset, after the block restored it
    assert proc.returncode != 0 and "GENERATOR_EXTRA_ARGS: unbound variable" in proc.stderr
    assert (tmp_path / "rec" / "module").read_text() == "load cuda/12.4\n"


def test_the_env_block_stops_the_host_when_slurmfabric_is_missing(tmp_path) -> None:
    """Without set -e in the host, a failed check must still stop the script."""
    config = JobConfig.from_dict(SRUN_CONFIG)
    proc = run_host(tmp_path, generate(config), with_sf=False)
    assert proc.returncode == 2 and "slurmfabric not found" in proc.stderr
    assert not (tmp_path / "rec" / "srun").exists()
    assert "generator: done" not in proc.stdout


@pytest.mark.parametrize(("launcher", "counts"), [
    ({"type": "srun-pmix"}, '--nodes="$SLURM_NNODES" --ntasks-per-node=8 '),
    ({"type": "nccl-tests"}, '--nodes="$SLURM_NNODES" --ntasks-per-node=8 '),
    ({"type": "torchrun"}, '--nodes="$SLURM_NNODES" --ntasks-per-node=1 '),
    ({"type": "mpirun"}, '-np "$((SLURM_NNODES * 8))" --map-by ppr:8:node'),
])
def test_every_launcher_names_its_own_counts(launcher, counts) -> None:
    data = {"job": {"nodes": 2, "gpus_per_node": 8}, "launcher": launcher,
            "program": {"command": [] if launcher["type"] == "nccl-tests" else ["x"]}}
    assert counts in slurmfabric.render_launch(JobConfig.from_dict(data))


def test_render_sbatch_header_is_the_scripts_sbatch_lines() -> None:
    data = {**SRUN_CONFIG, "job": {**SRUN_CONFIG["job"], "extra_sbatch": ["--gres=nvme:1"]}}
    config = JobConfig.from_dict(data)
    header = slurmfabric.render_sbatch_header(config)
    lines = header.splitlines()
    assert lines and all(line.startswith("#SBATCH ") for line in lines)
    script_lines = [line for line in slurmfabric.render_sbatch(config).splitlines()
                    if line.startswith("#SBATCH ")]
    assert lines == script_lines and lines[-1] == "#SBATCH --gres=nvme:1"
    assert "#SBATCH --ntasks-per-node=8" in lines
    assert "render_sbatch_header" in slurmfabric.__all__  # the stable API


# --- configs from dicts: the same one-line errors as files ------------------------------

BAD = {"job": {"nodes": -1, "nodez": 2, "time": "soon"},
       "launcher": {"type": "srun"}, "program": {"command": ["x"]}}


def _toml_problems(tmp_path: Path) -> list[str]:
    path = tmp_path / "bad.toml"
    path.write_text('[job]\nnodes = -1\nnodez = 2\ntime = "soon"\n[launcher]\ntype = "srun"\n'
                    '[program]\ncommand = ["x"]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, site_defaults="")
    return info.value.problems


@pytest.mark.parametrize("build", [
    lambda d: JobConfig(**d),
    JobConfig.from_dict,
    lambda d: load_config(data=d, site_defaults=""),
])
def test_a_bad_dict_gives_the_files_one_line_errors(build, tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        build(BAD)
    assert info.value.problems == _toml_problems(tmp_path)
    assert all("\n" not in line for line in info.value.problems)
    assert len(info.value.problems) == 3
    assert info.value.hint and "examples/*.toml" in info.value.hint


def test_data_and_path_together_are_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not both"):
        load_config(tmp_path / "x.toml", data={}, site_defaults="")
    with pytest.raises(ConfigError, match="accepted: a table"):
        load_config(data=["job"], site_defaults="")  # type: ignore[arg-type]


# --- environment sources: opt-in for a library, on for the CLI -----------------------------

def test_slurmfabric_variables_are_ignored_by_the_library_unless_asked(monkeypatch) -> None:
    monkeypatch.setenv("SLURMFABRIC_JOB__NODES", "5")
    monkeypatch.setenv("SLURMFABRIC_PROGRAM__ENV__SNEAKY", "1")
    assert JobConfig(**SRUN_CONFIG).job.nodes == 2
    assert JobConfig.from_dict(SRUN_CONFIG).program.env == {"OMP_NUM_THREADS": "4"}
    assert load_config(data=SRUN_CONFIG, site_defaults="").job.nodes == 2
    opted = load_config(data=SRUN_CONFIG, site_defaults="", environment=True)
    assert opted.job.nodes == 5 and opted.program.env["SNEAKY"] == "1"


def test_site_defaults_variable_is_an_environment_source_too(monkeypatch, tmp_path) -> None:
    site = tmp_path / "site.toml"
    site.write_text('[job]\nqos = "site"\n')
    monkeypatch.setenv("SLURMFABRIC_SITE_DEFAULTS", str(site))
    if not os.path.exists("/etc/slurmfabric/defaults.toml"):  # that file is the site's own
        assert load_config(data=SRUN_CONFIG).job.qos is None
    assert load_config(data=SRUN_CONFIG, environment=True).job.qos == "site"


def test_the_cli_still_reads_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("SLURMFABRIC_JOB__NODES", "5")
    monkeypatch.setenv("SLURMFABRIC_SITE_DEFAULTS", "")
    assert cli.main(["render", "--set", "launcher.type=srun", "--set", "job.gpus_per_node=8",
                     "--set", 'program.command=["x"]']) == 0
    assert "#SBATCH --nodes=5" in capsys.readouterr().out


def test_the_docs_generator_block_runs_as_written(tmp_path) -> None:
    """docs/python-api.md's generator block, executed, gives a host script that runs."""
    import readme_examples

    code = "\n".join(readme_examples.block_after("## Splicing the blocks",
                                                 page="docs/python-api.md"))
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/python-api.md", "exec"), namespace)  # noqa: S102
    host = str(namespace["host"])
    assert host.startswith("#!/bin/bash\n#SBATCH --gpus-per-node=8\n")
    proc = run_host(tmp_path, host)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("start \n")
    launch = (tmp_path / "rec" / "srun").read_text().splitlines()[-1]
    assert launch.startswith("--nodes=2 --ntasks-per-node=8 ")
