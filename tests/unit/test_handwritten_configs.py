"""Issue 31: for every real sbatch script in tests/fixtures/scripts, a config written by hand
(handwritten/<script>.toml, from the script and docs/launch.md, not from the importer)
renders, passes shellcheck, and reproduces the original's job request, environment and
launch argv when both scripts run among the recording stand-ins of ``import --check``
(job/importer/check.py: the one comparison engine). What a config cannot express is an exact
expected difference below, each with its reason (also in the config's header comment).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmfabric.config.loader import load_config
from slurmfabric.config.models import JobConfig
from slurmfabric.job.importer.check import check
from slurmfabric.job.render import render_sbatch

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"
HANDWRITTEN = SCRIPTS / "handwritten"
NAMES = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file() and p.suffix != ".md")

_HEAD = ("accelerate launch     --num_processes 16     --num_machines 4     --rdzv_backend c10d"
         "     --main_process_ip node1     --main_process_port 29500     ")

# script -> [(difference, reason)]: every difference the check reports, exactly.
# <check> stands for the check's temporary directory (the scripts' $PWD and its parent).
EXPECTED: dict[str, list[tuple[str, str]]] = {
    "accelerate_multinode.sh": [
        ("request: --gres=gpu:4 is not requested",
         "gap: srun runs one task per GPU; no field requests GPUs for 1 task per node"),
        (f"launch env CMD: '{_HEAD}  ' becomes None",
         "the command line the script built holds the head node it looked up"),
        (f"launch env LAUNCHER: '{_HEAD}' becomes None", "the same, without the program"),
    ],
    "awsome_cpu_ddp_container.sbatch": [
        ("launch argv: ['python', '-u', '<check>/ddp.py', '5000000', '10'] becomes "
         "['python', '-u', '../ddp.py', '5000000', '10']",
         "$(dirname \"$PWD\") is computed at run time; fields hold data (relative path)"),
        ("srun options: ['--container-image=<check>/work/pytorch.sqsh', "
         "'--container-mounts=<check>', '-l'] becomes ['--container-image=./pytorch.sqsh', "
         "'--container-mounts=..', '-l']", "the same, for the image and the mount"),
    ],
    "awsome_megatron_gpt.sbatch": [
        ("request: --gres=gpu:8 is not requested",
         "the script requests its GPUs twice; one form is modelled, the other refused"),
        ("srun options: ['--container-image=<check>/work/megatron-training.sqsh', "
         "'--container-mounts=/fsx:/fsx', '-l'] becomes "
         "['--container-image=./megatron-training.sqsh', '--container-mounts=/fsx:/fsx', '-l']",
         "$(pwd) in the image's default is computed at run time; the field holds data"),
    ],
    "mleng_srun_launcher.slurm": [
        ("batch-shell commands: ['before: tee -a main_log.txt'] becomes []",
         "`| tee -a main_log.txt`: slurmfabric's launch is not piped"),
    ],
    "mleng_torchrun_launcher.slurm": [
        ("launch env CMD: 'python -u -m torch.distributed.run     --nproc_per_node 8     "
         "--nnodes 2     --rdzv_endpoint node1:6000     --rdzv_backend c10d     "
         "--max_restarts 0     --role node1:     --tee 3      my_train_script.py ' becomes None",
         "the command line the script built holds its own rendezvous (slurmfabric derives it)"),
        ("torchrun --role: 'node1:' becomes None",
         "--role `hostname -s`: is a run-time value; torchrun_args hold data"),
        ("batch-shell commands: ['before: tee -a main_log.txt'] becomes []",
         "`| tee -a main_log.txt`: slurmfabric's launch is not piped"),
    ],
}


def _config(name: str) -> JobConfig:
    return load_config(HANDWRITTEN / f"{name}.toml")


def _normal(text: str) -> str:
    return re.sub(r"/\S*?sf-import-check-[^/'\s]+", "<check>", text)


def test_every_script_has_a_handwritten_config_with_its_header() -> None:
    assert len(NAMES) >= 10
    assert sorted(p.name.removesuffix(".toml") for p in HANDWRITTEN.glob("*.toml")) == NAMES
    for name in NAMES:
        text = (HANDWRITTEN / f"{name}.toml").read_text(encoding="utf-8")
        assert text.startswith(f"# Hand-written for ../{name} "), name
        assert "Not expressed" in text or "not expressed" in text.lower(), name
    assert set(EXPECTED) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_handwritten_config_renders_and_passes_shellcheck(name: str, tmp_path: Path) -> None:
    assert shutil.which("shellcheck"), "shellcheck is missing: apt-get install shellcheck"
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(_config(name)), encoding="utf-8")
    proc = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("name", NAMES)
def test_handwritten_config_reproduces_the_original(name: str) -> None:
    report = check((SCRIPTS / name).read_text(encoding="utf-8"), _config(name))
    assert report.original_exit == report.rendered_exit == 0
    expected = [difference for difference, _reason in EXPECTED.get(name, [])]
    assert [_normal(d) for d in report.differences] == expected


def test_the_comparison_sees_a_wrong_handwritten_config() -> None:
    """The equalities above can fail: one changed value in a config that fits is reported."""
    config = _config("torchtitan_multinode.slurm")
    program = config.program.model_copy(update={
        "env": {**config.program.env, "NCCL_DEBUG": "INFO"},
        "params": {**config.program.params, "CONFIG": "llama3_8b"},
        "teardown": []})
    wrong = config.model_copy(update={"program": program})
    report = check((SCRIPTS / "torchtitan_multinode.slurm").read_text(encoding="utf-8"), wrong)
    assert "launch env NCCL_DEBUG: 'WARN' becomes 'INFO'" in report.differences
    assert any(d.startswith("launch argv:") and "'llama3_8b'" in d for d in report.differences)
    assert ("batch-shell commands: ['before: dcgmi profile --pause', "
            "'after: dcgmi profile --resume'] becomes ['before: dcgmi profile --pause']"
            ) in report.differences


def test_a_sourced_setup_file_does_not_fail_shellcheck(tmp_path: Path) -> None:
    """`source env.sh` (an env to activate) passes the render-time check (warnings and up);
    the rendered script must pass a plain shellcheck too, though it cannot follow the file
    (SC1091, info): the header disables that one code when setup/teardown exist."""
    for field in ("setup", "teardown"):
        config = load_config(data={"job": {"ntasks_per_node": 1}, "launcher": {"type": "srun"},
                                   "program": {"command": ["hostname"],
                                               field: ["source activate-env.sh"]}})
        script = tmp_path / f"{field}.sbatch"
        script.write_text(render_sbatch(config), encoding="utf-8")
        proc = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True,
                              text=True, check=False)
        assert proc.returncode == 0, proc.stdout
