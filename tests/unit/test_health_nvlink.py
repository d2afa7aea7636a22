"""NVLink links and counters, and the NVSwitch fabric, on recorded real outputs.

Every parsed file is a capture published by someone else (tests/fixtures/health/nvlink/,
each with its source in SOURCES.md). The hook tests replay them through the fake
nvidia-smi; 8-GPU reports are assembled from one real GPU block of the same capture.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fake_slurm, hgx_node, hgx_root, nvlink_scenario, slurm_nodes, write_config

from slurmfabric.health.checks import nvlink, xid
from slurmfabric.health.hookscript import EXIT_NODE_BAD
from slurmfabric.health.model import FAIL, OK, WARN, Context

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "health" / "nvlink"
NODE = "gpu007"


def text(name: str) -> str:
    return (FIX / name).read_text()


def facts(*names: str, counters: str | None = None) -> nvlink.NvlinkFacts:
    links, gpu_names = nvlink.parse_status("\n".join(text(n) for n in names))
    return nvlink.NvlinkFacts(links, gpu_names,
                              nvlink.parse_errors(text(counters)) if counters else None, "x")


def test_status_captures_parse_per_gpu_and_link() -> None:
    links, names = nvlink.parse_status(text("a100-nvlink-s-gpu7-azure.txt"))  # tab + space
    assert names == {7: "NVIDIA A100-SXM4-80GB"} and links[7] == {k: 25.0 for k in range(12)}
    links, _ = nvlink.parse_status(text("h100-nvlink-s-bottlerocket4418.txt"))  # spaces
    assert sorted(links) == [0, 1] and set(links[1].values()) == {26.562}
    assert len(links[0]) == 18
    links, _ = nvlink.parse_status(text("v100-nvlink-s-inactive-azhpc-diag73.txt"))
    assert links == {3: {0: 25.781, 1: 25.781, 2: 25.781, 3: None, 4: 25.781, 5: None}}
    for name in ("a100-nvlink-s-all-inactive-azure.txt", "b200-nvlink-s-all-inactive-"
                 "gpud1085.txt"):
        links, _ = nvlink.parse_status(text(name))
        assert list(links.values()) == [{}]  # "all links are inActive": no active link


def test_a_gpu_with_links_down_fails_against_its_peers_or_the_config() -> None:
    result = nvlink.check_links(facts("v100-nvlink-s-inactive-azhpc-diag73.txt"),
                                {"nvlinks": 6}, Context("prolog", NODE))
    assert result.status == FAIL
    assert result.reason == "GPU3 4/6 NVLinks active (links 3,5 inactive)"
    mixed = facts("a100-nvlink-s-gpu7-azure.txt", "a100-nvlink-s-all-inactive-azure.txt")
    result = nvlink.check_links(mixed, {}, Context("prolog", NODE))  # peers set the bar: 12
    assert result.status == FAIL
    assert result.reason == "GPU6 0/12 NVLinks active (all links inactive)"
    assert nvlink.check_links(facts("a100-nvlink-s-gpu7-azure.txt"), {},
                              Context("prolog", NODE)).status == OK
    only7 = Context("prolog", NODE, job_gpus=frozenset({7}))  # the job's GPUs only
    assert nvlink.check_links(mixed, {}, only7).status == OK


def test_links_below_the_expected_speed_fail() -> None:
    result = nvlink.check_links(facts("a100-nvlink-s-gpu7-azure.txt"),
                                {"nvlink_speed_gbps": 26.562}, Context("prolog", NODE))
    assert result.status == FAIL
    assert result.reason == ("GPU7 NVLink 0,1,2,3,4,5,6,7,8,9,10,11 at 25 GB/s, expected "
                             "26.562 GB/s")


def test_error_counters_parse_and_are_judged_as_job_deltas() -> None:
    counters = nvlink.parse_errors(text("h100-nvlink-e-ml-engineering.txt"))
    assert sorted(counters[0]) == [0, 1, 17]  # the capture elides links 2-16
    assert counters[0][17] == {"replay": 0, "recovery": 0, "crc": 0}
    assert nvlink.parse_errors(text("gb300-nvlink-e-srt-slurm307.txt")) == {
        0: {0: {"replay": 0, "recovery": 0, "crc": 0}}}
    now = facts("h100-nvlink-s-gpu0.txt", counters="h100-nvlink-e-ml-engineering.txt")
    before = json.loads(json.dumps(nvlink.snapshot(now)))  # as the state file keeps it
    now.counters[0][17].update(recovery=2, crc=40)
    epilog = Context("epilog", NODE, job_id="5", nvlink_before=before)
    result = nvlink.check_errors(now, {}, epilog)
    assert result.status == FAIL
    assert result.reason == "GPU0 link 17 recovery +2 during the job (limit 0)"  # crc +40 ok
    assert nvlink.check_errors(now, {"nvlink_delta_max": {"recovery": 5}}, epilog).status == OK
    no_snapshot = Context("check", NODE)
    assert nvlink.check_errors(now, {}, no_snapshot).status == OK  # counts since driver load
    assert nvlink.check_errors(now, {"nvlink_abs_max": {"crc": 10}}, no_snapshot).reason == (
        "GPU0 link 17 crc=40 (limit 10)")


def fabric_of(*names: str, manager: bool = True) -> nvlink.FabricFacts:
    body = ""
    for i, name in enumerate(names):  # fragments without their GPU header get one
        part = text(name)
        body += part if part.startswith("=") else f"GPU 00000000:{18 + i}:00.0\n{part}"
    return nvlink.FabricFacts(["0000:05:00.0"], manager, nvlink.parse_fabric(body), True)


def test_fabric_blocks_of_real_nodes() -> None:
    hgx = fabric_of("h100-sxm-565-q-fabric.txt")
    assert len(hgx.gpus) == 8 and hgx.gpus["0000:18:00.0"]["State"] == "Completed"
    assert nvlink.check_fabric(hgx, {}, None).status == OK
    down = nvlink.check_fabric(fabric_of("h100-sxm-565-q-fabric.txt", manager=False), {}, None)
    assert down.status == FAIL and down.reason.startswith("Fabric Manager (nv-fabricmanager) "
                                                          "is not running")
    full = nvlink.parse_fabric(text("h100-sxm-565-q-gpu0.txt"))  # the whole -q block of GPU0
    assert full == {"0000:18:00.0": {"State": "Completed", "Status": "Success",
                                     "CliqueId": "0", "ClusterUUID": "00000000-0000-0000-0000-"
                                     "000000000000", "Bandwidth": "N/A"}}


@pytest.mark.parametrize(("name", "status", "reason"), [
    ("q-fabric-insufficient-resources-azhpc-images506.txt", FAIL,
     "GPU 0000:18:00.0 fabric status 'Insufficient Resources', expected 'Success'"),
    ("q-fabric-health-unhealthy-dra626.txt", FAIL, "GPU 0000:18:00.0 fabric health "
     "'Unhealthy'"),
    ("a100-sxm4x4-555-q-fabric-na.txt", WARN, "GPU 0000:68:00.0 reports no fabric state (N/A)"),
    ("h100-nvl-550-q-fabric-na.txt", WARN, "GPU 0000:"),
])
def test_fabric_failures_and_boards_without_registration(name, status, reason) -> None:
    result = nvlink.check_fabric(fabric_of(name), {}, None)
    assert result.status == status and result.reason.startswith(reason), result.reason


def test_nvswitches_and_fabric_manager_are_found_in_sysfs_and_proc(tmp_path: Path) -> None:
    root = hgx_root(tmp_path)
    assert nvlink.nvswitches(str(root)) == ["0000:05:00.0", "0000:06:00.0"]
    assert nvlink.fabric_manager_running(str(root))
    assert nvlink.fabric_switches({"sysfs_root": str(root)}) == ["0000:05:00.0", "0000:06:00.0"]
    assert nvlink.fabric_switches({"sysfs_root": str(root), "nvswitch": False}) is None
    assert nvlink.fabric_switches({"sysfs_root": str(tmp_path / "none")}) is None
    assert nvlink.fabric_switches({"sysfs_root": str(tmp_path / "none"),
                                   "nvswitch": True}) == []  # B200: not PCI devices


def hook(kind: str, env: dict[str, str], job: str = "700") -> subprocess.CompletedProcess:
    env = {**env, "SLURMD_NODENAME": NODE, "SLURM_JOB_ID": job}
    return subprocess.run([sys.executable, "-m", "slurmfabric", "health", kind], env=env,
                          capture_output=True, text=True, timeout=60)


def setup(tmp: Path, smi: Path, root: Path) -> tuple[dict[str, str], Path]:
    state = tmp / "state"
    node = hgx_node(NODE, "h100-535-healthy", None, nvidia_smi=str(smi), sysfs_root=str(root),
                    rdma_ports=0)
    cfg = write_config(tmp / "health.toml", state, [node])
    env = fake_slurm(tmp, {NODE: ("IDLE", "")})
    env["SLURMFABRIC_HEALTH_CONFIG"] = str(cfg)
    return env, state


def test_hgx_hooks_check_links_counters_and_fabric(tmp_path: Path) -> None:
    """An NVSwitch board is found in sysfs and every NVLink check runs without any config;
    a recovery during the job drains the node in its epilog."""
    root = hgx_root(tmp_path / "root")
    smi = nvlink_scenario(tmp_path)
    env, state = setup(tmp_path, smi, root)
    assert hook("prolog", env).returncode == 0
    report = json.loads((state / "reports" / f"last-{NODE}.json").read_text())
    status = {c["check"]: c["status"] for c in report["checks"]}
    assert status["gpu.nvlink"] == "ok" and status["gpu.fabric"] == "ok"
    saved = json.loads((state / "jobs" / f"{NODE}-700.json").read_text())
    assert saved["nvlink"]["2"]["5"] == {"replay": 0, "recovery": 0, "crc": 0}
    (smi.parent / "nvlink-e.txt").unlink()
    nvlink_scenario(tmp_path / "later", errors={(2, 5): {"recovery": 1}})
    shutil.copy(tmp_path / "later" / "smi" / "nvlink-e.txt", smi.parent / "nvlink-e.txt")
    assert hook("epilog", env).returncode == EXIT_NODE_BAD
    assert slurm_nodes(env)[NODE]["reason"] == (
        "slurmfabric: gpu.nvlink_errors: GPU2 link 5 recovery +1 during the job (limit 0)")


def test_hgx_prolog_drains_for_a_dead_link_and_a_stopped_fabric_manager(tmp_path) -> None:
    root = hgx_root(tmp_path / "root", manager=False)
    env, _ = setup(tmp_path, nvlink_scenario(tmp_path, down={4: [7]}), root)
    assert hook("prolog", env).returncode == EXIT_NODE_BAD
    reason = slurm_nodes(env)[NODE]["reason"]
    assert reason.startswith("slurmfabric: gpu.nvlink: GPU4 17/18 NVLinks active (links 7 "
                             "inactive) (+1 more: gpu.fabric)"), reason


def test_an_xid_names_the_gpu_by_its_device_minor(tmp_path: Path) -> None:
    """/proc/driver/nvidia/gpus/<pci>/information (a real file, proc-information-l4-
    snapd14893.txt) gives the /dev/nvidiaN number Slurm's gres counts in."""
    info = tmp_path / "proc/driver/nvidia/gpus/0000:2b:00.0"
    info.mkdir(parents=True)
    shutil.copy(FIX / "proc-information-l4-snapd14893.txt", info / "information")
    assert xid.gpu_minor(str(tmp_path), "0000:2b:00") == 0
    assert xid.gpu_minor(str(tmp_path), "0000:3a:00") is None
    lines = (FIX.parent / "xid" / "kmsg_lines.txt").read_text().splitlines()
    log, cursor = tmp_path / "kmsg", str(tmp_path / "cursor")
    log.write_text("6,1,0,-;start\n")
    xid.collect(str(log), cursor, str(tmp_path))
    log.write_text(f"6,1,0,-;start\n3,2,10,-;{lines[0]}\n")
    found = xid.collect(str(log), cursor, str(tmp_path))
    assert xid.check_xid(found, {}, None).reason.startswith("Xid 79 on GPU0 0000:2b:00 (")
