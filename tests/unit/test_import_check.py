"""``slurmfabric import --check``: both scripts run among recording stand-ins, and every
difference in request, launch argv, environment, launcher options or batch-shell commands
is reported (job/importer/check.py, job/importstubs.py).

Until the issue-31 fields ([A] setup/teardown/params/pass_args/torchrun lists, [B] request
fields) are merged, most imported configs do not load. The machinery is tested on the real
scripts today's fields express (the FSDP and the nccl-tests mpirun scripts, whose only
newer field is an unobservable setup), on mutations of them that a check must catch, and on
small scripts; the full per-script checks are xfailed with the missing fields named, and
run for real once those fields exist.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from slurmfabric.cli import main as cli_main
from slurmfabric.config.models import JobConfig
from slurmfabric.errors import ConfigError
from slurmfabric.job.importer import import_script
from slurmfabric.job.importer.check import check

SCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "scripts"
NAMES = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file() and p.suffix != ".md")

# The fields agreed for issue 31 that this branch's models may not have yet.
AGREED = {
    ("job", "gpus_per_task"), ("job", "gpu_type"), ("job", "gpu_request"),
    ("job", "cpus_per_gpu"), ("job", "mem_per_cpu"), ("job", "mem_per_gpu"),
    ("job", "wait_all_nodes"), ("job", "ntasks_per_core"), ("job", "exclude"),
    ("job", "nodelist"), ("job", "distribution"), ("job", "hint"),
    ("program", "setup"), ("program", "teardown"), ("program", "teardown_on_failure"),
    ("program", "task_setup"), ("program", "params"), ("program", "pass_args"),
    ("launcher", "torchrun"), ("launcher", "torchrun_args"), ("launcher", "bind"),
    ("steps",),
}


def _today(data: dict[str, Any]) -> dict[str, Any]:
    """The config without the agreed fields this branch's models do not know."""
    out: dict[str, Any] = {}
    for section, value in data.items():
        if section not in JobConfig.model_fields:
            continue
        model = JobConfig.model_fields[section].annotation
        known = getattr(model, "model_fields", {})
        out[section] = {k: v for k, v in value.items() if k in known}
    return out


def _imported(name: str) -> tuple[str, dict[str, Any]]:
    text = (SCRIPTS / name).read_text()
    return text, import_script(text).config


def _config(data: dict[str, Any]) -> JobConfig:
    return JobConfig.model_validate(data)


@pytest.mark.parametrize("name", ["awsome_fsdp_llama2.sbatch",
                                  "awsome_nccl_tests_mpirun.sbatch"])
def test_real_scripts_today_fields_check_same(name: str) -> None:
    text, data = _imported(name)
    dropped = set(data["program"]) - set(_today(data)["program"])
    assert dropped <= {"setup"}  # set -ex, a HyperPod if-block, an mpirun hostname probe
    report = check(text, _config(_today(data)))
    assert report.differences == []
    assert report.original_exit == report.rendered_exit == 0


def _fsdp() -> tuple[str, dict[str, Any]]:
    text, data = _imported("awsome_fsdp_llama2.sbatch")
    return text, _today(data)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["program"]["env"].update(FI_PROVIDER="tcp"), "launch env FI_PROVIDER: 'efa'"),
    (lambda d: d["program"]["env"].pop("NCCL_DEBUG"), "launch env NCCL_DEBUG: 'INFO' becomes None"),
    (lambda d: d["program"]["command"].pop(), "launch argv:"),
    (lambda d: d["launcher"].pop("srun_args"), "srun options: ['-l'] becomes []"),
    (lambda d: d["launcher"].update(nproc_per_node=4), "torchrun --nproc-per-node: '8' becomes"),
    (lambda d: d["job"].pop("exclusive"), "request: --exclusive is not requested"),
    (lambda d: d["job"].update(nodes=2), "request: --nodes=4 becomes --nodes=2"),
])
def test_check_catches_a_changed_config(change: Any, expected: str) -> None:
    text, data = _fsdp()
    data = copy.deepcopy(data)
    change(data)
    report = check(text, _config(data))
    assert any(d.startswith(expected) for d in report.differences), report.differences


def test_check_catches_mpirun_options() -> None:
    text, data = _imported("awsome_nccl_tests_mpirun.sbatch")
    data = _today(data)
    data["launcher"]["mpirun_args"] = data["launcher"]["mpirun_args"][3:]  # no --mca pml
    data["program"]["env_prepend"] = {}
    report = check(text, _config(data))
    assert "mpirun --mca pml: '^ucx' becomes None" in report.differences
    assert any(d.startswith("launch env LD_LIBRARY_PATH: '/usr/local/cuda-12.4/lib:")
               for d in report.differences)


ORIGINAL = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --gpus-per-node=8
#SBATCH --job-name=t
export NCCL_DEBUG=INFO
dcgmi profile --pause
srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint $(hostname):29500 train.py --lr 1
"""
CONFIG = {"job": {"nodes": 2, "gpus_per_node": 8, "name": "t"},
          "launcher": {"type": "torchrun", "nproc_per_node": 8},
          "program": {"command": ["python", "-u", "train.py", "--lr", "1"],
                      "env": {"NCCL_DEBUG": "INFO"}}}


def test_check_sees_batch_shell_commands() -> None:
    report = check(ORIGINAL, _config(CONFIG))
    assert report.differences == [
        "batch-shell commands: ['before: dcgmi profile --pause'] becomes []"]
    same = check(ORIGINAL.replace("dcgmi profile --pause\n", ""), _config(CONFIG))
    assert same.same
    assert same.added == ["request: slurmfabric adds --ntasks-per-node=1"]  # torchrun: 1 task


def test_cli_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    # No testbed in this state directory: the stand-in mode, which says it is weaker.
    monkeypatch.setenv("SLURMFABRIC_TESTBED_DIR", str(tmp_path / "no-testbed"))
    good = tmp_path / "good.sh"
    good.write_text(ORIGINAL.replace("dcgmi profile --pause\n", ""))
    assert cli_main(["import", str(good), "--check", "-o", str(tmp_path / "c.toml")]) == 0
    err = capsys.readouterr().err
    assert "check: the rendered script requests" in err
    assert "check: no testbed runs (slurmfabric testbed up): both scripts run with bash " \
           "among stand-ins, a weaker check" in err
    # A run-time word in the program's argv stays literal text: the check shows it.
    odd = tmp_path / "odd.sh"
    odd.write_text(ORIGINAL.replace("dcgmi profile --pause\n", "").replace("--lr 1",
                                                                           "--seed $RANDOM"))
    assert cli_main(["import", str(odd), "--check", "--stand-ins", "-o",
                     str(tmp_path / "d.toml")]) == 1
    err = capsys.readouterr().err
    assert "check: --stand-ins given:" in err
    assert "check: differs: launch argv:" in err and "'$RANDOM'" in err


# --- every real script, once the agreed fields exist ---

# Expected with all issue-31 fields: the differences that are real leftovers of the import.
EXPECTED_DIFFERENCES = {
    "awsome_cpu_ddp_container.sbatch": ["launch argv:", "srun options:"],  # $(dirname "$PWD")
    "awsome_megatron_gpt.sbatch": ["request: --gpus-per-node=8", "srun options:"],  # $(pwd)
    "mleng_torchrun_launcher.slurm": ["torchrun --role:",  # `hostname -s`:
                                      "batch-shell commands:",  # | tee -a main_log.txt
                                      # CMD, kept as code, holds the rendezvous text the
                                      # script built: slurmfabric's port, not 6000.
                                      "launch env CMD:"],
    "mleng_srun_launcher.slurm": ["batch-shell commands:"],  # | tee -a main_log.txt
    # accelerate launch is [launcher.per_node] now; these stand-ins do not follow that form
    # (no 'accelerate', 'bash' among them), so the rendered script stops there. The real
    # testbed runs the form: tests/cluster/test_import_cluster.py.
    "accelerate_multinode.sh": ["launch: the rendered script started no program",
                                "exit code: 0 becomes 127"],
}
EXPECTED_INVALID: dict[str, str] = {}


def _problems(data: dict[str, Any]) -> list[str]:
    """``field.path: what`` per problem; JobConfig raises pydantic's error before the
    issue-31 merge and a ConfigError (one line per problem) after it."""
    try:
        _config(data)
    except ValidationError as exc:
        return [".".join(str(p) for p in e["loc"]) + ": " + e["msg"] for e in exc.errors()]
    except ConfigError as exc:
        return list(exc.problems)
    return []


@pytest.mark.parametrize("name", NAMES)
def test_full_import_checks(name: str) -> None:
    text, data = _imported(name)
    problems = _problems(data)
    if problems:
        locs = {tuple(line.split(":", 1)[0].split(".")[:2]) for line in problems}
        missing = sorted(".".join(loc) for loc in locs if loc in AGREED or loc[:1] in AGREED)
        if missing and len(missing) == len(locs):
            pytest.xfail("needs the issue-31 fields not merged here: " + ", ".join(missing))
        assert name in EXPECTED_INVALID, problems
        assert any(line.startswith(EXPECTED_INVALID[name]) for line in problems), problems
        return
    config = _config(data)
    report = check(text, config)
    expected = EXPECTED_DIFFERENCES.get(name, [])
    for start in expected:
        assert any(d.startswith(start) for d in report.differences), (start, report.differences)
    unexplained = [d for d in report.differences if not any(d.startswith(s) for s in expected)]
    assert unexplained == []


def test_check_runs_no_program_but_the_stand_ins(tmp_path: Path) -> None:
    """rm, cp, touch... are recorded, never run: a file outside the check stays."""
    keep = tmp_path / "precious"
    keep.write_text("x")
    original = ORIGINAL.replace("dcgmi profile --pause\n",
                                f"rm -f {keep}\ntouch {tmp_path}/new\nsleep 600\n")
    report = check(original, _config(CONFIG))
    assert keep.exists() and not (tmp_path / "new").exists()
    assert report.differences == [
        f"batch-shell commands: ['before: rm -f {keep}', 'before: touch {tmp_path}/new', "
        "'before: sleep 600'] becomes []"]
