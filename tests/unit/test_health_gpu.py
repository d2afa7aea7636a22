"""GPU checks over recorded nvidia-smi output (three driver generations) and a fake NVML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import NVML_FAKE, nvsmi

from slurmfabric._common.probe import ProbeError
from slurmfabric.health.checks import gpu
from slurmfabric.health.model import FAIL, OK, WARN, Context
from slurmfabric.health.siteconfig import NODE_DEFAULTS

EXPECT = {**NODE_DEFAULTS, "gpus": 8, "gpu_source": "nvidia-smi"}
PROLOG = Context("prolog", "gpu001")


def judge(facts: gpu.GpuFacts, expect=None, ctx=PROLOG) -> dict[str, object]:
    expect = expect or EXPECT
    return {name: func(facts, expect, ctx) for name, (func, _, _) in gpu.CHECKS.items()}


@pytest.mark.parametrize("scenario", ["a100-470-healthy", "h100-535-healthy", "h200-550-healthy"])
def test_healthy_generations_pass_every_check(scenario: str) -> None:
    facts = gpu.collect_nvidia_smi(nvsmi(scenario), 5)
    assert len(facts.gpus) == 8
    results = judge(facts)
    assert {n: r.status for n, r in results.items() if r.status != OK} == {}
    # The idle-downshifted links (Gen1 on odd GPUs) are reported, not failed.
    assert results["gpu.pcie"].values["GPU1"].startswith("Gen1/")


def test_old_driver_falls_back_to_clocks_throttle_reasons() -> None:
    facts = gpu.collect_nvidia_smi(nvsmi("a100-470-hw-thermal"), 5)
    assert facts.driver == "470.182.03"
    assert facts.gpus[4]["clocks_event_reasons"] == 0x40
    result = gpu.check_throttle(facts, EXPECT, PROLOG)
    assert result.status == FAIL and result.reason == "GPU4 HW thermal slowdown"


@pytest.mark.parametrize(
    ("scenario", "check", "status", "reason"),
    [
        ("h100-535-ecc", "gpu.ecc", FAIL, "GPU3 2 uncorrected volatile ECC errors"),
        ("h100-535-remap-pending", "gpu.row_remap", FAIL, "GPU5 row remap pending"),
        ("a100-470-remap-failed", "gpu.row_remap", FAIL, "GPU2 row remapping failed"),
        ("a100-470-retired-pending", "gpu.retired_pages", FAIL, "GPU1 page retirement pending"),
        ("h100-535-hw-slowdown", "gpu.throttle", FAIL, "GPU6 HW slowdown"),
        ("h200-550-power-brake", "gpu.throttle", FAIL, "GPU1 HW power brake slowdown"),
        ("a100-470-hw-thermal", "gpu.throttle", FAIL, "GPU4 HW thermal slowdown"),
        ("h100-535-sw-thermal", "gpu.throttle", WARN, "GPU0 SW thermal slowdown"),
        ("h100-535-hot", "gpu.temperature", FAIL, "GPU7 at 91 C (limit 87 C)"),
        ("h100-535-pcie-x8", "gpu.pcie", FAIL, "GPU2 PCIe x8, expected x16"),
        ("h100-535-busy", "gpu.processes", FAIL, "GPU0 held before the job by pid 48213"),
        ("h100-535-seven-gpus", "gpu.count", FAIL, "7 GPUs visible, expected 8"),
        ("h100-535-reset-required", "gpu.count", FAIL, "[GPU requires reset]"),
    ],
)
def test_each_failure_is_caught_by_its_check_only(scenario, check, status, reason) -> None:
    results = judge(gpu.collect_nvidia_smi(nvsmi(scenario), 5))
    assert results[check].status == status
    assert reason in results[check].reason
    others = {n: r.status for n, r in results.items() if n != check and r.status != OK}
    if scenario != "h100-535-reset-required":  # that cell also blanks temperature/ECC
        assert others == {}


@pytest.mark.parametrize(("scenario", "code", "text"), [
    ("fell-off-bus", 15, "GPU has fallen off the bus"),
    ("driver-not-loaded", 9, "driver is not loaded"),
])
def test_documented_exit_codes_are_node_faults(scenario, code, text) -> None:
    with pytest.raises(ProbeError) as info:
        gpu.collect_nvidia_smi(nvsmi(scenario), 5)
    assert info.value.node_fault
    assert f"exit {code}" in str(info.value) and text in str(info.value)


def test_scoped_to_the_jobs_gpus_on_a_shared_node() -> None:
    facts = gpu.collect_nvidia_smi(nvsmi("h100-535-ecc"), 5)  # GPU3 is bad
    mine = Context("prolog", "gpu001", "7", frozenset({0, 1}))
    theirs = Context("prolog", "gpu001", "8", frozenset({2, 3}))
    assert gpu.check_ecc(facts, EXPECT, mine).status == OK
    assert gpu.check_ecc(facts, EXPECT, theirs).status == FAIL


def test_context_reads_job_gpus_and_failed_job_from_env() -> None:
    ctx = Context.from_env("epilog", "n1", {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "2,3",
                                            "SLURM_JOB_EXIT_CODE2": "0:9"})
    assert ctx.job_gpus == frozenset({2, 3}) and ctx.job_id == "42" and ctx.deep
    calm = Context.from_env("epilog", "n1", {"SLURM_JOB_EXIT_CODE": "0",
                                             "CUDA_VISIBLE_DEVICES": "GPU-abc"})
    assert not calm.deep and calm.job_gpus is None
    failed = Context.from_env("epilog", "n1", {"SLURM_JOB_DERIVED_EC": "256"})
    assert failed.deep


def test_short_rows_are_an_error_not_an_index_past_the_end() -> None:
    text = "index, temperature.gpu\n0, 31\n1\n"
    with pytest.raises(ProbeError, match="1 cells, expected 2"):
        gpu.parse_csv(text, {"index": "index", "temperature.gpu": "temp_c"}, "--query-gpu")


def test_ecc_is_read_per_gpu_never_summed_to_zero() -> None:
    # The bug seen elsewhere: summing a one-column CSV always gave 0. Here GPU3 alone fails.
    facts = gpu.collect_nvidia_smi(nvsmi("h100-535-ecc"), 5)
    result = gpu.check_ecc(facts, EXPECT, PROLOG)
    assert result.values["GPU3"] == 2 and result.values["GPU2"] == 0


def _nvml(monkeypatch, tmp_path: Path, data: dict) -> None:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("FAKE_NVML_JSON", str(path))
    monkeypatch.setenv("PYTHONPATH", str(NVML_FAKE))


def test_nvml_source_matches_nvidia_smi_for_the_same_node(monkeypatch, tmp_path) -> None:
    data = json.loads((NVML_FAKE / "h100-healthy.json").read_text())
    _nvml(monkeypatch, tmp_path, data)
    facts = gpu.collect({**EXPECT, "gpu_source": "nvml"}, 10)
    assert facts.source == "nvml" and facts.driver == "535.154.05"
    smi = gpu.collect_nvidia_smi(nvsmi("h100-535-healthy"), 5)
    keys = ("bus_id", "ecc_uncorrected", "remap_pending", "pcie_width", "pcie_gen_max")
    for a, b in zip(facts.gpus, smi.gpus):
        assert gpu.normal_bus_id(a["bus_id"]) == gpu.normal_bus_id(b["bus_id"])
        assert [bool(a[k]) if k == "remap_pending" else a[k] for k in keys[1:]] == \
               [bool(b[k]) if k == "remap_pending" else b[k] for k in keys[1:]]
    assert all(r.status == OK for r in judge(facts).values())


def test_nvml_faults_reach_the_checks(monkeypatch, tmp_path) -> None:
    data = json.loads((NVML_FAKE / "h100-healthy.json").read_text())
    data["gpus"][6]["reasons"] = 0x80
    data["gpus"][2]["remap"] = [0, 3, 1, 0]
    data["gpus"][4]["pids"] = [777]
    _nvml(monkeypatch, tmp_path, data)
    results = judge(gpu.collect({**EXPECT, "gpu_source": "auto"}, 10))
    assert results["gpu.throttle"].reason == "GPU6 HW power brake slowdown"
    assert results["gpu.row_remap"].reason == "GPU2 row remap pending (GPU reset needed)"
    assert "GPU4 held before the job by pid 777" in results["gpu.processes"].reason


def test_nvml_lost_gpu_is_a_node_fault(monkeypatch, tmp_path) -> None:
    data = json.loads((NVML_FAKE / "h100-healthy.json").read_text())
    data["gpus"][1]["lost"] = True
    _nvml(monkeypatch, tmp_path, data)
    with pytest.raises(ProbeError, match="GPU1: GPU is lost") as info:
        gpu.collect({**EXPECT, "gpu_source": "nvml"}, 10)
    assert info.value.node_fault


def test_auto_falls_back_to_nvidia_smi_without_the_nvml_library(monkeypatch, tmp_path) -> None:
    _nvml(monkeypatch, tmp_path, {"init_error": 12, "driver": "", "gpus": []})
    facts = gpu.collect({**EXPECT, "gpu_source": "auto",
                         "nvidia_smi": nvsmi("h200-550-healthy")}, 10)
    assert facts.source == "nvidia-smi" and facts.driver == "550.90.07"
