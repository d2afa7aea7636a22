"""gpu.clocks over real ``nvidia-smi -q`` captures (tests/fixtures/corpus/gpu/SOURCES.md),
replayed by the fake nvidia-smi on a scenario directory (q.txt)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import NVSMI

from slurmfabric._common.probe import ProbeError
from slurmfabric.health import outputs, runner
from slurmfabric.health.checks import clocks, gpu
from slurmfabric.health.model import FAIL, OK, Context
from slurmfabric.health.siteconfig import NODE_DEFAULTS, resolve

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus" / "gpu"
PROLOG = Context("prolog", "gpu001")


def fake_smi(tmp: Path, capture: str | None = None, text: str | None = None) -> str:
    """A scenario directory: the fake nvidia-smi (a link, as in tests/fixtures/health/nvsmi)
    and the capture it replays for ``-q``."""
    out = tmp / "smi"
    out.mkdir(exist_ok=True)
    link = out / "nvidia-smi"
    if not link.exists():
        os.symlink(NVSMI / "fake-nvidia-smi", link)
    (out / "q.txt").write_text(text if text is not None else (CORPUS / capture).read_text())
    return str(link)


def collect(path: str) -> clocks.ClockFacts:
    return clocks.collect({"gpu_source": "nvidia-smi", "nvidia_smi": path}, 5)


def judge(path: str, **expect) -> object:
    return clocks.check_clocks(collect(path), {**NODE_DEFAULTS, **expect}, PROLOG)


@pytest.mark.parametrize(("capture", "gpus"), [
    ("v100x8-550-q.txt", 8), ("h200-550-q.txt", 1), ("a40x10-550-q.txt", 10),
    ("l40s-550-q.txt", 1), ("q-d-power-590-opengpu483.txt", 1),
])
def test_healthy_captures_pass(tmp_path: Path, capture: str, gpus: int) -> None:
    result = judge(fake_smi(tmp_path, capture))
    assert result.status == OK and result.reason == ""
    assert len(result.values) == gpus


def test_idle_gpus_downclock_legitimately(tmp_path: Path) -> None:
    # Every V100 idles at 135 MHz of 1530 MHz (Idle active, 0 %): never judged as slow.
    facts = collect(fake_smi(tmp_path, "v100x8-550-q.txt"))
    assert {(g["sm_mhz"], g["sm_max_mhz"], g["util_pct"]) for g in facts.gpus} == {
        (135.0, 1530.0, 0.0)}
    assert clocks.check_clocks(facts, NODE_DEFAULTS, PROLOG).status == OK


@pytest.mark.parametrize(("capture", "reason"), [
    ("gh200-550-q.txt", "GPU0 00000000:DD:00.0 power limit 700 W below its default 900 W "
     "(requested 900 W; capped outside the driver: BMC or firmware)"),
    ("q-d-power-capped-595-stackhpc975.txt", "GPU0 00000000:06:00.0 power limit 500 W below "
     "its default 700 W (requested 700 W; capped outside the driver: BMC or firmware)"),
])
def test_a_capped_power_limit_fails_and_names_the_figures(tmp_path, capture, reason) -> None:
    result = judge(fake_smi(tmp_path, capture))
    assert result.status == FAIL and result.reason == reason


def test_the_capped_captures_passed_every_check_before(tmp_path: Path) -> None:
    """Before gpu.clocks, the only power signal judged was the throttle bitmask: the capped
    GH200 idles (only Idle set), so gpu.throttle passes it."""
    facts = collect(fake_smi(tmp_path, "gh200-550-q.txt"))
    bits = {name: bit for bit, name in gpu.THROTTLE_BITS.items()}
    names = {"Idle": "GPU idle", "SW Power Cap": "SW power cap"}
    mask = sum(bits[names[r]] for r in facts.gpus[0]["reasons"])
    smi = gpu.GpuFacts([{"index": 0, "clocks_event_reasons": mask}], "nvidia-smi")
    assert gpu.check_throttle(smi, NODE_DEFAULTS, PROLOG).status == OK
    assert clocks.check_clocks(facts, NODE_DEFAULTS, PROLOG).status == FAIL


def test_the_tolerance_is_a_site_key(tmp_path: Path) -> None:
    path = fake_smi(tmp_path, "gh200-550-q.txt")  # 700 of 900 W: 22 % below
    assert judge(path, power_limit_tolerance=0.25).status == OK
    assert judge(path, power_limit_tolerance=0.2).status == FAIL


def test_requested_below_default_names_nvidia_smi_pl(tmp_path: Path) -> None:
    # Derived from the stackhpc capture: the same GPU after 'nvidia-smi -pl 500'.
    text = (CORPUS / "q-d-power-capped-595-stackhpc975.txt").read_text().replace(
        "Requested Power Limit                          : 700.00 W",
        "Requested Power Limit                          : 500.00 W")
    result = judge(fake_smi(tmp_path, text=text))
    assert result.reason.endswith("(requested 500 W (nvidia-smi -pl))")


def test_application_clocks_below_default_fail(tmp_path: Path) -> None:
    # Derived from the V100 capture: GPU0 after 'nvidia-smi -ac 877,1005'.
    text = (CORPUS / "v100x8-550-q.txt").read_text()
    head, _, rest = text.partition("    Applications Clocks\n        Graphics")
    text = head + "    Applications Clocks\n        Graphics" + rest.replace(
        ": 1312 MHz", ": 1005 MHz", 1)
    result = judge(fake_smi(tmp_path, text=text))
    assert result.status == FAIL
    assert result.reason == ("GPU0 00000000:00:04.0 applications graphics clock 1005 MHz "
                             "below its default 1312 MHz (nvidia-smi -rac resets it)")


def _power_brake_under_load(utilization: str | None) -> str:
    """The C4130 V100 report (q-clocks-power-brake-v100-l4rz.txt: HW Power Brake, SM 382
    MHz) under a GPU header, with the V100's Max Clocks from v100x8-550-q.txt; the
    utilization line is added by the test (the report did not include one)."""
    snippet = (CORPUS / "q-clocks-power-brake-v100-l4rz.txt").read_text()
    lines = ["==============NVSMI LOG==============", "", "GPU 00000000:1E:00.0"]
    lines += ["    " + line if line else "" for line in snippet.splitlines()]
    lines += ["    Max Clocks", "        SM                                : 1530 MHz"]
    if utilization is not None:
        lines += ["    Utilization", f"        Gpu                               : {utilization}"]
    return "\n".join(lines) + "\n"


def test_sm_clock_low_under_load_with_a_limiter_fails(tmp_path: Path) -> None:
    result = judge(fake_smi(tmp_path, text=_power_brake_under_load("100 %")))
    assert result.status == FAIL
    assert result.reason == ("GPU0 00000000:1E:00.0 SM clock 382 MHz of 1530 MHz at 100% "
                             "utilization (HW Slowdown, HW Power Brake Slowdown)")


@pytest.mark.parametrize("utilization", [None, "3 %"])
def test_sm_clock_is_not_judged_without_load(tmp_path: Path, utilization) -> None:
    assert judge(fake_smi(tmp_path, text=_power_brake_under_load(utilization))).status == OK


def test_an_old_board_that_reports_nothing_is_said_not_failed(tmp_path: Path) -> None:
    result = judge(fake_smi(tmp_path, "gtx680-470-q.txt"))
    assert result.status == OK and "not judged" in result.reason


def test_no_report_is_a_probe_error(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="no GPU sections"):
        collect(fake_smi(tmp_path, text="No devices were found\n"))


def test_registered_once_with_prometheus_metrics(tmp_path: Path) -> None:
    names = [s.name for s in runner.registry()]
    assert names.count("gpu.clocks") == 1
    cfg = resolve({"runner": {"state_dir": str(tmp_path / "state")},
                   "nodes": [{"gpus": 1, "gpu_source": "nvidia-smi",
                              "nvidia_smi": fake_smi(tmp_path, "gh200-550-q.txt"),
                              "rdma_ports": 0, "kmsg_source": os.devnull}]}, "gpu001", None)
    run = runner.run(cfg, Context("check", "gpu001"))
    result = next(r for r in run.results if r.check == "gpu.clocks")
    assert result.status == FAIL and result.blocking
    text = outputs.prometheus_text(run)
    assert 'slurmfabric_gpu_power_limit_watts{node="gpu001",gpu="0"} 700' in text
    assert 'slurmfabric_gpu_power_default_limit_watts{node="gpu001",gpu="0"} 900' in text
    assert 'slurmfabric_gpu_sm_clock_max_mhz{node="gpu001",gpu="0"} 1980' in text


def test_corpus_is_not_a_copy_of_other_fixtures() -> None:
    fixtures = CORPUS.parents[1]
    mine = {p.read_text() for p in CORPUS.glob("*.txt")}
    others = [p for p in fixtures.rglob("*.txt") if "corpus" not in p.parts]
    assert not [p for p in others if p.read_text(errors="replace") in mine]
    assert shutil.which("sh")  # the fake nvidia-smi is a shell script


def test_nvml_gives_the_same_verdict_as_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    """The fake NVML answers with the GH200 capture's own figures (mW and MHz, as NVML
    reports them): the NVML source reaches the same failure."""
    smi = collect(fake_smi(tmp_path, "gh200-550-q.txt")).gpus[0]
    mw = {k: int(smi[f"power_{k}_w"] * 1000) for k in ("enforced", "default", "min", "max")}
    data = {"driver": "550.127.05", "cuda": 12040, "gpus": [{
        "uuid": "GPU-35d58415-1094-5ad1-64d1-b797587d33a7", "name": "NVIDIA GH200 480GB",
        "bus_id": smi["bus_id"], "reasons": 0x1, "vbios": "96.00.8D.00.03",
        "power": {**mw, "limit": int(smi["power_requested_w"] * 1000)},
        "clocks": {"sm": 345, "sm_max": 1980, "app_graphics": 1980,
                   "app_default_graphics": 1980, "app_mem": 2619, "app_default_mem": 2619},
        "util": 0}]}
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("FAKE_NVML_JSON", str(path))
    monkeypatch.setenv("PYTHONPATH", str(NVSMI.parent / "nvml"))
    facts = clocks.collect({"gpu_source": "nvml"}, 10)
    assert facts.gpus[0]["reasons"] == ["Idle"] and facts.gpus[0]["sm_max_mhz"] == 1980
    result = clocks.check_clocks(facts, NODE_DEFAULTS, PROLOG)
    assert result.reason == judge(fake_smi(tmp_path, "gh200-550-q.txt")).reason
