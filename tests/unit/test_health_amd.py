"""The AMD GPU check family (health/checks/amd.py) on real amd-smi / rocm-smi reports,
replayed by a fake amd-smi on PATH-free absolute paths (tests/fixtures/health/amdsmi).

Real reports: tests/fixtures/corpus/amd/ (ROCm/amdsmi CHANGELOG examples, SOURCES.md) and
tests/fixtures/topology/real/amd/nourl_8x-mi308x-0x74a2_rocm-smi-showtopo.txt. No public
report of a failing AMD GPU was found whole, so each failure below is a real report with
the one value a failure changes, said where it is done."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import write_config

from slurmfabric.health import hooks, runner
from slurmfabric.health.checks import amd
from slurmfabric.health.model import ERROR, FAIL, OK, WARN

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = FIXTURES / "corpus" / "amd"
FAKE = FIXTURES / "health" / "amdsmi" / "fake-amd-smi"
SHOWTOPO = FIXTURES / "topology" / "real" / "amd" / "nourl_8x-mi308x-0x74a2_rocm-smi-showtopo.txt"

PCIE = "amdsmi-changelog-6.3-metric-pcie-2gpu-x16-32gts.txt"
POWER = "amdsmi-changelog-6.1.2-metric-power-2gpu-unthrottled.txt"
CLOCK = "amdsmi-changelog-6.1.1-metric-clock-1gpu-gfx0-7.txt"
ECC = "amdsmi-changelog-6.1.1-metric-ecc-ecc-blocks-zero.txt"
PCIE_OLD = "amdsmi-changelog-6.1-metric-P-x16-16gts.txt"
TOPOLOGY = "amdsmi-changelog-6.1-topology-8gpu-all-xgmi.txt"


def real(name: str) -> str:
    return (CORPUS / name).read_text()


def scenario(tmp: Path, metric: str | None = None, topology: str | None = None,
             showtopo: str | None = None, gpus_in_sysfs: int = 2) -> dict:
    """A scenario directory with the fake tools and a sysfs root where amdgpu binds
    ``gpus_in_sysfs`` MI300X functions (class 0x120000, Documentation/gpu/amdgpu)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(parents=True)
    expect = {"sysfs_root": str(tmp / "root"), "amd_smi": str(bin_dir / "amd-smi"),
              "rocm_smi": str(bin_dir / "rocm-smi")}
    for tool, text in (("amd-smi", metric), ("rocm-smi", showtopo)):
        if text is not None:
            os.symlink(FAKE, bin_dir / tool)
    if metric is not None:
        (bin_dir / "metric.txt").write_text(metric)
    if topology is not None:
        (bin_dir / "topology.txt").write_text(topology)
    if showtopo is not None:
        (bin_dir / "showtopo.txt").write_text(showtopo)
    for k in range(gpus_in_sysfs):
        dev = tmp / "root/sys/bus/pci/drivers/amdgpu" / f"0000:{0x0c + 0x16 * k:02x}:00.0"
        dev.mkdir(parents=True)
        (dev / "class").write_text("0x120000\n")
    return expect


def judge(expect: dict) -> dict[str, object]:
    facts = amd.collect(expect, 10)
    return {name: func(facts, {**amd.FAMILY.defaults(), **expect}, None)
            for name, (func, _, _) in amd.CHECKS.items()}


def test_a_healthy_node_passes_every_check(tmp_path: Path) -> None:
    expect = scenario(tmp_path, real(PCIE) + real(POWER) + real(ECC) + real(CLOCK),
                      real(TOPOLOGY))
    results = judge(expect)
    assert {n: r.status for n, r in results.items()} == {n: OK for n in amd.CHECKS}, \
        {n: r.reason for n, r in results.items()}
    assert results["amd.count"].values["seen"] == 2
    assert results["amd.pcie"].values["gpu1"] == "x16 32 GT/s replays 0"
    assert results["amd.clocks"].values["gpu0_gfx_max_mhz"] == 1800
    assert results["amd.xgmi"].values["xgmi_links"]["0000:0c:00.0"] == 7


def test_parse_metric_merges_reports_and_skips_wrapped_lists() -> None:
    gpus = amd.parse_metric(real(PCIE) + real(ECC) + "GPU: 0\n    USAGE:\n"
                            "        JPEG_ACTIVITY: [0 %, 0 %,\n            0 %, 0 %]\n")
    assert sorted(gpus) == [0, 1]
    assert gpus[0]["PCIE"]["REPLAY_COUNT"] == "0"
    assert gpus[0]["ECC"]["TOTAL_DEFERRED_COUNT"] == "0"
    assert gpus[0]["ECC_BLOCKS"]["SDMA"]["CORRECTABLE_COUNT"] == "0"
    assert gpus[0]["USAGE"] == {"JPEG_ACTIVITY": "[0 %, 0 %,"}
    assert amd.parse_metric(real(PCIE_OLD))[0]["PCIE"]["L0_TO_RECOVERY_COUNT"] == "1"


def test_uncorrectable_ecc_fails_and_names_the_block(tmp_path: Path) -> None:
    # the real all-zero report, with 3 uncorrectable errors in UMC (HBM)
    text = real(ECC).replace("TOTAL_UNCORRECTABLE_COUNT: 0", "TOTAL_UNCORRECTABLE_COUNT: 3")
    umc = "UMC:\n            CORRECTABLE_COUNT: 0\n            UNCORRECTABLE_COUNT: "
    text = text.replace(umc + "0", umc + "3")
    result = judge(scenario(tmp_path, text, gpus_in_sysfs=1))["amd.ecc"]
    assert result.status == FAIL
    assert result.reason == "GPU 0: 3 uncorrectable, 0 deferred ECC errors in UMC"


def test_correctable_ecc_past_the_limit_warns(tmp_path: Path) -> None:
    text = real(ECC).replace("TOTAL_CORRECTABLE_COUNT: 0", "TOTAL_CORRECTABLE_COUNT: 250")
    result = judge(scenario(tmp_path, text, gpus_in_sysfs=1))["amd.ecc"]
    assert result.status == WARN
    assert result.reason == "GPU 0: 250 correctable ECC errors (limit 100)"


def test_a_narrow_pcie_link_fails_the_speed_is_not_judged(tmp_path: Path) -> None:
    # GPU 1 of the real two-GPU report trained at x8; GPU 0 at 16 GT/s (PCIe DPM at idle)
    lines = real(PCIE).split("GPU: 1")
    text = lines[0].replace("SPEED: 32 GT/s", "SPEED: 16 GT/s") + "GPU: 1" + \
        lines[1].replace("WIDTH: 16", "WIDTH: 8")
    result = judge(scenario(tmp_path, text))["amd.pcie"]
    assert result.status == FAIL
    assert result.reason == "GPU 1: PCIe x8, expected x16"
    assert judge(scenario(tmp_path / "site", real(PCIE)) | {"amd_pcie_width": 32}) \
        ["amd.pcie"].reason == "GPU 0: PCIe x16, expected x32; GPU 1: PCIe x16, expected x32"


def test_a_capped_clock_fails_a_throttle_status_warns(tmp_path: Path) -> None:
    # the real one-GPU clock report twice, the second GPU's GFX ceiling capped at 1300 MHz
    capped = real(CLOCK).replace("GPU: 0", "GPU: 1").replace("MAX_CLK: 1800 MHz",
                                                            "MAX_CLK: 1300 MHz")
    result = judge(scenario(tmp_path, real(CLOCK) + capped))["amd.clocks"]
    assert result.status == FAIL
    assert result.reason == "GPU 1: GFX max clock 1300 MHz, others 1800 MHz"
    throttled = real(POWER).replace("THROTTLE_STATUS: UNTHROTTLED\n\nGPU: 1",
                                    "THROTTLE_STATUS: THROTTLED\n\nGPU: 1")
    warned = judge(scenario(tmp_path / "t", throttled))["amd.clocks"]
    assert warned.status == WARN and warned.reason == "GPU 0 THROTTLED"


def test_a_gpu_without_one_xgmi_link_fails(tmp_path: Path) -> None:
    # the real 8-GPU LINK TYPE TABLE with the link between 0000:5c and 0000:9f over PCIe
    text = real(TOPOLOGY)
    head, table = text.split("LINK TYPE TABLE:")
    rows = table.split("\n")
    for i, row in enumerate(rows):
        cells = row.split()
        if cells and cells[0] in ("0000:5c:00.0", "0000:9f:00.0"):
            col = 5 if cells[0] == "0000:5c:00.0" else 4
            cells[col] = "PCIE"
            rows[i] = " ".join(cells)
    result = judge(scenario(tmp_path, real(PCIE), head + "LINK TYPE TABLE:" + "\n".join(rows)))
    assert result["amd.xgmi"].status == FAIL
    assert result["amd.xgmi"].reason == ("0000:5c:00.0: 6 XGMI links, others 7; "
                                         "0000:9f:00.0: 6 XGMI links, others 7")


def test_a_gpu_missing_from_the_tool_fails_the_count(tmp_path: Path) -> None:
    result = judge(scenario(tmp_path, real(PCIE), gpus_in_sysfs=3))["amd.count"]
    assert result.status == FAIL
    assert result.reason == "2 GPUs seen by amd-smi, expected 3"
    site = judge(scenario(tmp_path / "s", real(PCIE)) | {"amd_gpus": 8})["amd.count"]
    assert site.reason == "2 GPUs seen by amd-smi, expected 8"


def test_rocm_smi_where_amd_smi_is_absent(tmp_path: Path) -> None:
    results = judge(scenario(tmp_path, showtopo=SHOWTOPO.read_text(), gpus_in_sysfs=8))
    assert results["amd.count"].status == OK and results["amd.count"].values["seen"] == 8
    assert results["amd.xgmi"].status == OK
    assert results["amd.xgmi"].values["xgmi_links"]["GPU3"] == 7
    for name in ("amd.ecc", "amd.pcie", "amd.clocks"):
        assert results[name].status == WARN
        assert results[name].reason == "rocm-smi only (no amd-smi): not read"


def test_through_the_hook_a_failing_tool_is_an_error_and_ecc_drains(tmp_path: Path) -> None:
    text = real(ECC).replace("TOTAL_DEFERRED_COUNT: 0", "TOTAL_DEFERRED_COUNT: 1")
    expect = scenario(tmp_path / "n", real(PCIE) + text, real(TOPOLOGY))
    cfg = write_config(tmp_path / "h.toml", tmp_path / "s",
                       [{"match": "*", "gpus": 0, "rdma_ports": 0, **expect}])
    run = hooks.check("mi300x-01", str(cfg))
    status = {r.check: r.status for r in run.results if r.check.startswith("amd.")}
    assert status == {"amd.count": OK, "amd.ecc": FAIL, "amd.pcie": OK, "amd.clocks": OK,
                      "amd.xgmi": OK}
    assert next(r for r in run.results if r.check == "amd.ecc").reason == \
        "GPU 0: 0 uncorrectable, 1 deferred ECC errors"
    (tmp_path / "n/bin/exit-code").write_text("1\n")
    (tmp_path / "n/bin/message").write_text("ERROR:root:Unable to detect any GPU devices\n")
    broken = hooks.check("mi300x-01", str(cfg))
    errors = {r.check: (r.status, r.reason) for r in broken.results if r.check.startswith("amd.")}
    assert errors["amd.count"] == (ERROR, "amd-smi metric exit 1: ERROR:root:Unable to "
                                          "detect any GPU devices")


@pytest.mark.parametrize("value", [0, -1, "eight"])
def test_site_keys_are_checked_at_load(tmp_path: Path, value: object) -> None:
    from slurmfabric.errors import ConfigError
    from slurmfabric.health import siteconfig

    if value == 0:  # 0 turns the family off, like gpus = 0
        assert not amd.enabled({"amd_gpus": 0})
        return
    with pytest.raises(ConfigError, match="amd_gpus"):
        siteconfig.resolve({"nodes": [{"amd_gpus": value}]}, "n1", None)


def test_registered_and_gated() -> None:
    assert {"amd.count", "amd.ecc", "amd.pcie", "amd.clocks", "amd.xgmi"} <= \
        {s.name for s in runner.registry()}
