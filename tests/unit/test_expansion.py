"""Shell expansion is explicit (program.env_prepend, env_append, env_expand) and never silent:
a data value that looks like shell syntax is named at render time with the field that does
what the user meant (issue 31: 8 of 13 real scripts rendered a literal $LD_LIBRARY_PATH)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cleanenv import clean_env

from slurmfabric.config import load_config
from slurmfabric.errors import UsageError
from slurmfabric.job import k8s
from slurmfabric.job.expansion import lookalikes
from slurmfabric.job.render import render_env_block, render_sbatch

CANARY = "/tmp/slurmfabric-expansion-canary"


def _config(*sets: str):
    return load_config(sets=["launcher.type=srun", "job.nodes=2", "job.gpus_per_node=4",
                             "job.partition=debug",
                             'program.command=["python", "train.py"]', *sets])


def _exports(script: str, names: tuple[str, ...], preset: dict[str, str]) -> dict[str, str]:
    """Run the script's export lines for ``names`` in bash -u with ``preset`` in the
    environment; return what each variable holds afterwards."""
    lines = [line for line in script.splitlines()
             if line.startswith(tuple(f"export {n}=" for n in names))]
    probe = "; ".join(f'printf "%s\\0" "${{{n}-<unset>}}"' for n in names)
    proc = subprocess.run(["bash", "-u", "-c", "\n".join([*lines, probe])],
                          env=clean_env(**{"PATH": "/usr/bin:/bin", **preset}),
                          capture_output=True, text=True, check=True)
    return dict(zip(names, proc.stdout.split("\0")[:-1]))


def test_prepend_and_append_add_to_the_run_time_value() -> None:
    script = render_env_block(_config('program.env_prepend.LD_LIBRARY_PATH=/opt/efa/lib',
                                      'program.env_append.PYTHONPATH=/work/src'))
    held = _exports(script, ("LD_LIBRARY_PATH", "PYTHONPATH"),
                    {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "PYTHONPATH": "/site"})
    assert held == {"LD_LIBRARY_PATH": "/opt/efa/lib:/usr/local/cuda/lib64",
                    "PYTHONPATH": "/site:/work/src"}
    # unset (or empty) before: no stray ':' (an empty component means the current directory)
    assert _exports(script, ("LD_LIBRARY_PATH", "PYTHONPATH"), {}) == {
        "LD_LIBRARY_PATH": "/opt/efa/lib", "PYTHONPATH": "/work/src"}


def test_env_expand_expands_named_variables_and_nothing_else(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    value = f"run-${{SLURM_JOB_ID}}/$(touch {canary})/`touch {canary}`/$HOME/*/${{USER}}"
    script = render_env_block(_config(f"program.env_expand.OUT_DIR={value}"))
    held = _exports(script, ("OUT_DIR",), {"SLURM_JOB_ID": "42", "USER": "ada",
                                          "HOME": "/home/ada"})
    assert held["OUT_DIR"] == (f"run-42/$(touch {canary})/`touch {canary}`/$HOME/*/ada")
    assert not canary.exists()


def test_env_expand_of_an_unset_variable_stops_the_script() -> None:
    script = render_env_block(_config('program.env_expand.OUT=${NOT_SET_ANYWHERE}/x'))
    line = next(ln for ln in script.splitlines() if ln.startswith("export OUT="))
    proc = subprocess.run(["bash", "-u", "-c", line], env=clean_env(PATH="/usr/bin:/bin"),
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "NOT_SET_ANYWHERE" in proc.stderr


@pytest.mark.parametrize("sets,expected", [
    (['program.env.LD_LIBRARY_PATH=/opt/efa/lib:$LD_LIBRARY_PATH'],
     "program.env.LD_LIBRARY_PATH: '/opt/efa/lib:$LD_LIBRARY_PATH' stays literal text and "
     "replaces LD_LIBRARY_PATH; to add to it, set "
     "program.env_prepend.LD_LIBRARY_PATH = '/opt/efa/lib'"),
    (['program.env.PATH=${PATH}:/opt/bin'],
     "program.env.PATH: '${PATH}:/opt/bin' stays literal text and replaces PATH; to add to it, "
     "set program.env_append.PATH = '/opt/bin'"),
    (['program.env.CKPT=/ckpt/$SLURM_JOB_ID'],
     "program.env.CKPT: '/ckpt/$SLURM_JOB_ID' stays literal text (values are data); for "
     "run-time variables set program.env_expand.CKPT with ${NAME} forms, e.g. "
     "'/ckpt/${SLURM_JOB_ID}'"),
    (['program.command=["python", "train.py", "--out", "$HOME/run"]'],
     "program.command[3]: '$HOME/run' reaches the program as literal text"),
    (['program.command=["python", "train.py", "--files", "data/*.json"]'],
     "program.command[3]: 'data/*.json' is passed as is, not expanded as a glob"),
    (['program.workdir=$PWD/run'], "program.workdir: '$PWD/run' stays literal text"),
])
def test_a_value_that_looks_like_shell_is_named_with_the_explicit_field(sets, expected) -> None:
    found = lookalikes(_config(*sets))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_plain_values_and_the_explicit_fields_are_quiet() -> None:
    assert lookalikes(_config('program.env.OMP_NUM_THREADS=4',
                              'program.env_expand.OUT=${SLURM_JOB_ID}',
                              'program.env_prepend.PATH=/opt/bin')) == []


def test_render_warns_on_stderr_and_still_renders(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfabric", "render", "--set", "launcher.type=srun",
         "--set", "job.gpus_per_node=4",
         "--set", 'program.command=["python", "train.py"]', "--set",
         'program.env.LD_LIBRARY_PATH=/opt/efa/lib:$LD_LIBRARY_PATH'],
        capture_output=True, text=True, cwd=tmp_path,
        env=clean_env(PATH="/usr/bin:/bin", PYTHONPATH=str(Path(__file__).parents[2])))
    assert proc.returncode == 0, proc.stderr
    assert ("slurmfabric: warning: program.env.LD_LIBRARY_PATH: "
            "'/opt/efa/lib:$LD_LIBRARY_PATH' stays literal text") in proc.stderr
    assert "export LD_LIBRARY_PATH='/opt/efa/lib:$LD_LIBRARY_PATH'" in proc.stdout


def test_the_rendered_script_passes_shellcheck(tmp_path: Path) -> None:
    assert shutil.which("shellcheck"), "shellcheck is missing: apt-get install shellcheck"
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(_config(
        'program.env_prepend.LD_LIBRARY_PATH=/opt/efa/lib',
        'program.env_append.PATH=/opt/bin',
        "program.env_expand.OUT=/scratch/${SLURM_JOB_ID}/$(id)")))
    proc = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout


def test_kubernetes_refuses_what_it_cannot_express() -> None:
    config = load_config(sets=["launcher.type=torchrun", "program.container_image=img:1",
                               "job.gpus_per_node=8",
                               'program.command=["python", "train.py"]',
                               'program.env_prepend.LD_LIBRARY_PATH=/opt/efa/lib'])
    with pytest.raises(UsageError, match="program.env_prepend has no Kubernetes form"):
        k8s.build(config, "pytorchjob")


def test_the_docs_block_renders_what_it_says(tmp_path: Path) -> None:
    """docs/launch.md's example, loaded as written, gives the values its comments promise."""
    import re

    text = (Path(__file__).parents[2] / "docs" / "launch.md").read_text()
    block = re.search(r"```toml\n(\[program.env_prepend\].*?)```", text, re.S).group(1)
    job = tmp_path / "job.toml"
    job.write_text('[launcher]\ntype = "srun"\n[job]\ngpus_per_node = 1\n'
                   '[program]\ncommand = ["train"]\n' + block)
    script = render_env_block(load_config(str(job)))
    held = _exports(script, ("LD_LIBRARY_PATH", "PATH", "CHECKPOINT_DIR"),
                    {"LD_LIBRARY_PATH": "/usr/lib/x", "PATH": "/usr/bin", "USER": "ada",
                     "SLURM_JOB_ID": "7"})
    assert held == {"LD_LIBRARY_PATH": "/opt/efa/lib:/usr/lib/x",
                    "PATH": "/usr/bin:/opt/amazon/efa/bin",
                    "CHECKPOINT_DIR": "/scratch/ada/7"}
