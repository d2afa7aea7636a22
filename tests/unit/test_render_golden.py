"""Golden files of rendered scripts, one per scenario, compared line by line.

To accept intended changes: SLURMFABRIC_UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py
then review the diff of tests/golden/ before committing it.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from slurmfabric import __version__
from slurmfabric.config import load_config
from slurmfabric.job.render import render_sbatch

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
UPDATE = os.environ.get("SLURMFABRIC_UPDATE_GOLDEN") == "1"

# scenario -> (config file or None, --set overrides)
SCENARIOS: dict[str, tuple[str | None, list[str]]] = {
    "smoke-cpu": ("examples/smoke-cpu.toml", []),
    "h100-fsdp": ("examples/h100-fsdp.toml", []),
    "nccl-tests-sweep": ("examples/nccl-tests-sweep.toml", []),
    "resume-cpu": ("examples/resume-cpu.toml", []),
    "srun-gpu": (None, ["launcher.type=srun", "job.nodes=4", "job.gpus_per_node=8",
                        "job.cpus_per_task=12", "job.partition=gpu", "job.time=4:00:00",
                        'program.command=["python", "train.py", "--name", "run 1"]',
                        "program.container_image=nvcr.io#nvidia/pytorch:24.05-py3",
                        'program.container_mounts=["/data:/data"]', "fabric.type=roce"]),
    "srun-pmix": (None, ["launcher.type=srun-pmix", "job.nodes=2", "job.ntasks_per_node=4",
                         "job.partition=debug", 'program.command=["./mpi_app", "--in", "a b"]']),
    "mpirun": (None, ["launcher.type=mpirun", "job.nodes=2", "job.ntasks_per_node=2",
                      "job.partition=debug", 'program.command=["./allreduce"]',
                      "program.env.OMPI_MCA_btl=self,tcp"]),
}


def render_scenario(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for var in list(os.environ):
        if var.startswith("SLURMFABRIC_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("SLURMFABRIC_SITE_DEFAULTS", "")
    path, sets = SCENARIOS[name]
    config = load_config(REPO / path if path else None, sets)
    rerender = f"slurmfabric render -c {path}" if path else "slurmfabric render --set ..."
    # No slurmfabric_bin: a script never names the login node's install unless asked.
    text = render_sbatch(config, rerender=rerender)
    # The version is normalised so a release bump does not rewrite every golden file.
    return text.replace(f"slurmfabric {__version__} from", "slurmfabric VERSION from")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    actual = render_scenario(name, monkeypatch)
    golden = GOLDEN / f"{name}.sh"
    if UPDATE:
        golden.write_text(actual)
    assert golden.is_file(), f"{golden} missing; create it with SLURMFABRIC_UPDATE_GOLDEN=1"
    expected = golden.read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            str(golden), "rendered"))
        pytest.fail(f"rendered script differs from {golden}:\n{diff}\n"
                    "If the change is intended, accept it with:\n"
                    "  SLURMFABRIC_UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py",
                    pytrace=False)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_render_from_script_gives_the_same_script(name: str, monkeypatch, tmp_path) -> None:
    """Whole-script equality: --from-script re-renders exactly what was rendered."""
    from slurmfabric import cli

    for var in list(os.environ):
        if var.startswith("SLURMFABRIC_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("SLURMFABRIC_SITE_DEFAULTS", "")
    path, sets = SCENARIOS[name]
    script = tmp_path / "job.sh"
    argv = ["render", "-o", str(script)] + (["-c", str(REPO / path)] if path else [])
    argv += [arg for item in sets for arg in ("--set", item)]
    assert cli.main(argv) == 0
    again = tmp_path / "again.sh"
    assert cli.main(["render", "--from-script", str(script), "-o", str(again)]) == 0
    assert again.read_text() == script.read_text()
