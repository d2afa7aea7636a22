"""gpu.dcgm on recorded ``dcgmi diag -j`` reports of both layouts (DCGM 3.x and 4.x).

The reports are in tests/fixtures/health/dcgm/ with their sources in SOURCES.md; one 3.x
failure is reconstructed from DCGM's own code and a real failure text, and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fake_slurm, hgx_node, write_config

from slurmfabric._common.probe import ProbeError
from slurmfabric.errors import ConfigError
from slurmfabric.health import siteconfig
from slurmfabric.health.checks import dcgm
from slurmfabric.health.hookscript import EXIT_NODE_BAD
from slurmfabric.health.model import FAIL, OK, WARN, Context

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "health" / "dcgm"


def report(name: str) -> dict:
    text = (FIX / name).read_text()
    if name.startswith("dcgm4-r3-fragment"):  # one test object: wrap it as dcgmi does
        text = json.dumps({"DCGM Diagnostic": {"test_categories": [
            {"category": "Stress", "tests": [json.loads(text)]}]},
            "metadata": {"version": "4.1.1"}})
    return {**dcgm.parse(text), "level": 3, "exit": 0}


def test_both_layouts_give_per_gpu_results() -> None:
    three = report("dcgm3-r3-pass.json")  # 3.0-3.2: "gpu_ids"
    gpu_tests = [r for r in three["results"] if r["gpu"] is not None]
    assert gpu_tests and {r["gpu"] for r in gpu_tests} == {0}
    assert {r["status"] for r in three["results"]} == {"Pass", "Skip"}  # no Fail
    four = report("dcgm4-r3-fragment-diagnostic-test.json")  # 4.x: entity ids
    assert [r["gpu"] for r in four["results"]] == list(range(8))
    assert four["version"] == "4.1.1"
    skipped = report("dcgm3-r3-skip-t400-trimmed.json")  # 3.3: "gpu_id"
    assert {r["status"] for r in skipped["results"]} == {"Skip"}


@pytest.mark.parametrize(("name", "status", "reason"), [
    ("dcgm3-r1-pass.json", OK, ""),
    ("dcgm3-r3-pass.json", OK, ""),
    ("dcgm4-r3-fragment-diagnostic-test.json", OK, ""),
    ("dcgm3-r3-skip-t400-trimmed.json", WARN, "DCGM level 3: no test ran (all skipped)"),
    ("dcgm3-r2-fail-memory-RECONSTRUCTED.json", FAIL,
     "DCGM level 3: GPU Memory on GPU0: GPU 0 Error using CUDA API cuCtxCreate"),
    ("dcgm4-r1-fail-gb10-persistence.json", FAIL,
     "DCGM level 3: software on GPU0: Persistence Mode: Persistence mode for GPU 0 is "
     "disabled."),
])
def test_each_report_is_judged_by_its_results(name, status, reason) -> None:
    result = dcgm.check_dcgm(report(name), {}, Context("check", "n1"))
    assert result.status == status and result.reason.startswith(reason), result.reason


def test_a_failure_on_another_jobs_gpu_is_not_this_jobs() -> None:
    facts = report("dcgm3-r2-fail-memory-RECONSTRUCTED.json")  # GPU 0 fails, GPU 1 passes
    assert dcgm.check_dcgm(facts, {}, Context("epilog", "n1",
                                              job_gpus=frozenset({1}))).status == OK


def test_what_is_not_a_report_is_an_error_of_the_checker() -> None:
    with pytest.raises(ProbeError, match="no JSON"):
        dcgm.parse("Error: unable to establish a connection to the specified host: localhost")
    with pytest.raises(ProbeError, match="without results"):
        dcgm.parse('{"runtime_error": "Couldn\'t connect to host engine"}')
    banner = "Successfully ran diagnostic for group.\n" + (FIX / "dcgm3-r1-pass.json").read_text()
    assert dcgm.parse(banner)["results"]  # text before the JSON is skipped


def test_levels_per_hook_and_deadlines() -> None:
    expect = {"dcgm_levels": {"epilog_failed": 2, "check": 1}, "dcgm_timeout_s": {"2": 900}}
    assert dcgm.level_for(expect, "prolog", False) == 0
    assert dcgm.level_for(expect, "epilog", False) == 0
    assert dcgm.level_for(expect, "epilog", True) == 2  # after a failed job
    assert dcgm.level_for(expect, "burnin", False) == 3  # the burn-in default
    assert dcgm.timeout_for(expect, 2) == 900 and dcgm.timeout_for(expect, 1) == 120


@pytest.mark.parametrize(("table", "message"), [
    ("dcgm_levels = { epilog_failled = 2 }", "dcgm_levels.'epilog_failled': not a hook"),
    ("dcgm_levels = { burnin = 5 }", "dcgm_levels.burnin = 5 should be a dcgmi diag level"),
    ('dcgm_timeout_s = { "2" = 0 }', 'dcgm_timeout_s.2 = 0 is outside 1..14400'),
    ('dcgm_timeout_s = { two = 60 }', "dcgm_timeout_s.'two': not a level"),
    ('nvlink_delta_max = { crc_errors = 5 }', "nvlink_delta_max.'crc_errors' is not an NVLink"),
])
def test_config_typos_are_named(tmp_path, table, message) -> None:
    path = tmp_path / "health.toml"
    path.write_text(f"[[nodes]]\n{table}\n")
    with pytest.raises(ConfigError) as err:
        siteconfig.load("n1", str(path))
    assert message in str(err.value)


def fake_dcgmi(tmp: Path, name: str, code: int) -> Path:
    path = tmp / "dcgmi"
    path.write_text(f'#!/bin/sh\necho "$*" > {tmp / "dcgmi.args"}\ncat {FIX / name}\n'
                    f"exit {code}\n")
    path.chmod(0o755)
    return path


def test_the_epilog_of_a_failed_job_runs_level_2_and_drains(tmp_path: Path) -> None:
    """dcgmi exits 226 after printing the report: the JSON decides, and names the GPU."""
    dcgmi = fake_dcgmi(tmp_path, "dcgm3-r2-fail-memory-RECONSTRUCTED.json", 226)
    cfg = write_config(tmp_path / "health.toml", tmp_path / "state", [hgx_node(
        "gpu007", "h100-535-healthy", None, dcgmi=str(dcgmi),
        dcgm_levels={"epilog_failed": 2})])
    env = fake_slurm(tmp_path, {"gpu007": ("IDLE", "")})
    env.update(SLURMFABRIC_HEALTH_CONFIG=str(cfg), SLURMD_NODENAME="gpu007",
               SLURM_JOB_ID="8")

    def epilog(**extra: str) -> int:
        return subprocess.run([sys.executable, "-m", "slurmfabric", "health", "epilog"],
                              env={**env, **extra}, capture_output=True, timeout=60).returncode

    assert epilog(SLURM_JOB_EXIT_CODE="0") == 0  # a job that succeeded: no diagnostic
    assert not (tmp_path / "dcgmi.args").exists()
    assert epilog(SLURM_JOB_EXIT_CODE="256") == EXIT_NODE_BAD
    assert (tmp_path / "dcgmi.args").read_text().split() == ["diag", "-r", "2", "-j"]
    state = json.loads((Path(env["FAKE_SCONTROL_STATE"])).read_text())["gpu007"]
    assert state["reason"].startswith("slurmfabric: gpu.dcgm: DCGM level 2: GPU Memory on GPU0")


def test_burn_in_fails_closed_when_dcgm_cannot_run(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "health.toml", tmp_path / "state", [hgx_node(
        "gpu007", "h100-535-healthy", None, dcgmi=str(tmp_path / "missing"))])
    env = {**fake_slurm(tmp_path, {}), "SLURMD_NODENAME": "gpu007"}
    out = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "burn-in", "--config",
                          str(cfg), "--results", str(tmp_path / "res")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "GPU burn-in FAILED: gpu.dcgm: " in out.stdout and "not found" in out.stdout
    saved = json.loads((tmp_path / "res" / "gpu-gpu007.json").read_text())
    assert saved["exit_code"] == 1 and saved["hook"] == "burnin"
    dcgmi = fake_dcgmi(tmp_path, "dcgm3-r3-pass.json", 0)
    cfg = write_config(tmp_path / "health.toml", tmp_path / "state", [hgx_node(
        "gpu007", "h100-535-healthy", None, dcgmi=str(dcgmi))])
    out = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "burn-in", "--config",
                          str(cfg), "--results", str(tmp_path / "res")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "GPU burn-in passed" in out.stdout, out.stdout + out.stderr
    assert (tmp_path / "dcgmi.args").read_text().split() == ["diag", "-r", "3", "-j"]
