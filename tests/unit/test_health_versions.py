"""node.versions and node.version_skew over real captures (tests/fixtures/corpus/versions
and corpus/gpu, SOURCES.md): HCA firmware from ibstat / ibv_devinfo written into a fake
sysfs, nvidia-smi -q and ofed_info -s replayed by fake binaries."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import fakesysfs
import pytest
from helpers import NVSMI, fake_slurm, h100_tree, hgx_node, slurm_nodes, write_config

from slurmfabric.errors import ConfigError
from slurmfabric.health import runner
from slurmfabric.health.checks import versions
from slurmfabric.health.hookscript import EXIT_NODE_BAD
from slurmfabric.health.model import FAIL, OK, WARN, Context
from slurmfabric.health.siteconfig import NODE_DEFAULTS, resolve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = FIXTURES / "corpus" / "versions"
GPU = FIXTURES / "corpus" / "gpu"


def firmware(capture: str) -> dict[str, str]:
    """HCA -> firmware from an ibstat (``CA 'x'`` / ``Firmware version:``) or ibv_devinfo
    (``hca_id:`` / ``fw_ver:``) capture: what the kernel shows as fw_ver."""
    text = (CORPUS / capture).read_text()
    names = re.findall(r"^(?:CA '([^']+)'|hca_id:\s*(\S+))", text, re.M)
    fws = re.findall(r"(?:Firmware version:|fw_ver:)\s*(\S+)", text)
    return {a or b: fw for (a, b), fw in zip(names, fws)}


def node_root(tmp: Path, hcas: dict[str, str], kernel: str = "5.15.0-94-generic",
              nccl: str | None = "2.21.5") -> Path:
    """A fake sysfs/procfs (tests/fakesysfs.py) with these HCAs and their fw_ver."""
    rdma = [fakesysfs.Rdma(name, f"pci0000:{i + 16:02x}/0000:{i + 16:02x}:01.0/"
                           f"0000:{i + 32:02x}:00.0") for i, name in enumerate(hcas)]
    files = {f"/sys/class/infiniband/{name}/fw_ver": fw for name, fw in hcas.items()}
    if nccl:
        files[f"/usr/lib/x86_64-linux-gnu/libnccl.so.{nccl}"] = ""
    node = fakesysfs.Node(numa={}, cpus="0-7", rdma=rdma, driver=None, kernel=kernel,
                          files=files)
    return fakesysfs.build(node, tmp / "root")


def fake_bin(tmp: Path, q_capture: str, ofed: str | None) -> dict[str, str]:
    """The fake nvidia-smi replaying a -q capture, and an ofed_info printing a capture."""
    smi = tmp / "smi"
    smi.mkdir()
    os.symlink(NVSMI / "fake-nvidia-smi", smi / "nvidia-smi")
    (smi / "q.txt").write_text((GPU / q_capture).read_text())
    keys = {"nvidia_smi": str(smi / "nvidia-smi"), "ofed_info": str(tmp / "no-ofed_info")}
    if ofed:
        script = tmp / "bin" / "ofed_info"
        script.parent.mkdir()
        script.write_text(f"#!/bin/sh\n[ \"$1\" = -s ] && exec cat '{CORPUS / ofed}'\nexit 1\n")
        script.chmod(0o755)
        keys["ofed_info"] = str(script)
    return keys


def expect_for(tmp: Path, q_capture: str, hca_capture: str, ofed: str | None = None,
               **extra) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    root = node_root(tmp, firmware(hca_capture))
    return {**NODE_DEFAULTS, "sysfs_root": str(root), **fake_bin(tmp, q_capture, ofed),
            **extra}


def test_inventory_reads_every_source(tmp_path: Path) -> None:
    expect = expect_for(tmp_path, "h200-550-q.txt", "ibstat-cx7-cx6dx-mooncake1999.txt",
                        "ofed_info-s-mlnx-ucxpy.txt")
    inv = versions.collect_local("gpu001", expect, 5)
    assert inv.versions == {
        "driver": "550.90.12", "cuda": "12.4", "vbios": {"0000:03:00.0": "96.00.A5.00.03"},
        "hca_fw": {"mlx5_0": "28.39.1002", "mlx5_1": "28.39.1002", "mlx5_10": "22.31.1014"},
        "ofed": "MLNX_OFED_LINUX-5.4-3.5.8.0", "kernel": "5.15.0-94-generic", "nccl": "2.21.5"}
    assert inv.unread == {}
    # HCA firmware compares per family: ConnectX-7 (28.x) and ConnectX-6 Dx (22.x) apart.
    flat = versions.flatten(inv.versions)
    assert flat["hca_fw:28"] == "28.39.1002" and flat["hca_fw:22"] == "22.31.1014"


def test_vbios_from_proc_driver_nvidia(tmp_path: Path) -> None:
    expect = expect_for(tmp_path, "h200-550-q.txt", "ibstat-cx6dx-l2fwdnv6.txt")
    info = Path(expect["sysfs_root"]) / "proc/driver/nvidia/gpus/0000:70:00.0/information"
    info.parent.mkdir(parents=True)
    info.write_text((FIXTURES / "health/nvlink/proc-information-l4-snapd14893.txt").read_text())
    inv = versions.collect_local("gpu001", expect, 5)
    assert inv.versions["vbios"] == {"0000:70:00.0": "95.04.65.00.13"}  # /proc wins over -q


def test_every_gpus_vbios_is_read(tmp_path: Path) -> None:
    # The V100 node mixes two VBIOS versions among its eight GPUs.
    expect = expect_for(tmp_path, "v100x8-550-q.txt", "ibstat-cx6dx-l2fwdnv6.txt")
    inv = versions.collect_local("gpu001", expect, 5)
    assert len(inv.versions["vbios"]) == 8
    assert versions.flatten(inv.versions)["vbios"] == "88.00.13.00.02,88.00.4F.00.09"


def test_missing_tools_fail_open_and_say_why(tmp_path: Path) -> None:
    # The ompi #9957 node: inbox rdma-core, 'ofed_info: command not found'.
    assert "command not found" in (CORPUS / "ofed_info-missing-ompi9957.txt").read_text()
    expect = expect_for(tmp_path, "v100x8-550-q.txt", "ibv_devinfo-cx4-ompi9957.txt")
    inv = versions.collect_local("gpu001", expect, 5)
    assert inv.versions["hca_fw"] == {"mlx5_0": "12.20.1820"}
    assert "not found" in inv.unread["ofed"] and "ofed" not in inv.versions
    assert versions.check_pins(inv, expect, Context("prolog", "gpu001")).status == OK
    pinned = {**expect, "versions": {"ofed": "MLNX_OFED_LINUX-5.4-3.5.8.0"}}
    result = versions.check_pins(inv, pinned, Context("prolog", "gpu001"))
    assert result.status == WARN
    assert result.reason.startswith("ofed pinned to MLNX_OFED_LINUX-5.4-3.5.8.0 but unreadable:")


def test_ofed_info_formats() -> None:
    assert versions.parse_ofed_info((CORPUS / "ofed_info-s-mlnx-ucxpy.txt").read_text()) == \
        "MLNX_OFED_LINUX-5.4-3.5.8.0"
    assert versions.parse_ofed_info((CORPUS / "ofed_info-s-internal-ucxpy.txt").read_text()) \
        == "OFED-internal-4.7-3.2.9"


@pytest.mark.parametrize(("pins", "status", "reason"), [
    ({"driver": "550.90.12", "cuda": "12.4"}, OK, ""),
    ({"driver": "550.54.15"}, FAIL, "driver 550.90.12 (pinned 550.54.15)"),
    ({"driver": ["550.54.15", "550.90.12"]}, OK, ""),
    ({"hca_fw": "28.39.2048"}, FAIL, "hca_fw mlx5_0 28.39.1002 (pinned 28.39.2048); "
     "hca_fw mlx5_1 28.39.1002 (pinned 28.39.2048)"),
    ({"hca_fw": ["28.39.1002", "22.39.1002"]}, FAIL, "hca_fw mlx5_10 22.31.1014 "
     "(pinned 22.39.1002)"),
    ({"hca_fw": "16.35.4030"}, OK, ""),  # no HCA of that family here: nothing to judge
    ({"vbios": "96.00.74.00.01"}, FAIL, "vbios 0000:03:00.0 96.00.A5.00.03 "
     "(pinned 96.00.74.00.01)"),
])
def test_pins(tmp_path: Path, pins: dict, status: str, reason: str) -> None:
    expect = expect_for(tmp_path, "h200-550-q.txt", "ibstat-cx7-cx6dx-mooncake1999.txt",
                        versions=pins)
    inv = versions.collect_local("gpu001", expect, 5)
    result = versions.check_pins(inv, expect, Context("prolog", "gpu001"))
    assert (result.status, result.reason) == (status, reason)


def test_pinned_firmware_per_family_with_ibv_devinfo(tmp_path: Path) -> None:
    expect = expect_for(tmp_path, "h200-550-q.txt", "ibv_devinfo-cx7-cx5-deepep38.txt",
                        versions={"hca_fw": "28.39.1002"})
    inv = versions.collect_local("gpu001", expect, 5)
    assert inv.versions["hca_fw"] == {"mlx5_2": "28.42.1000", "mlx5_3": "16.35.4030"}
    result = versions.check_pins(inv, expect, Context("prolog", "gpu001"))
    assert result.reason == "hca_fw mlx5_2 28.42.1000 (pinned 28.39.1002)"  # CX-5 not pinned


# Three nodes of one job: two GH200/V100 nodes on driver 550.127.05, one H200 on 550.90.12.
JOB = {"gpu001": "gh200-550-q.txt", "gpu002": "v100x8-550-q.txt", "gpu003": "h200-550-q.txt"}


def _job(tmp: Path, **extra) -> dict[str, dict]:
    shared = tmp / "shared"
    return {name: expect_for(tmp / name, capture, "ibstat-cx6dx-l2fwdnv6.txt",
                             versions_dir=str(shared), **extra)
            for name, capture in JOB.items()}


def test_a_node_unlike_the_jobs_majority_is_reported(tmp_path: Path) -> None:
    expects = _job(tmp_path)
    for name, expect in expects.items():  # each node's prolog leaves its inventory
        versions.collect(name, expect, 5, "prolog", "gpu[001-003]")
    results = {}
    for name, expect in expects.items():
        inv = versions.collect(name, expect, 5, "check", "gpu[001-003]")
        assert len(inv.peers) == 2
        results[name] = versions.check_drift(inv, expect, Context("prolog", name))
    assert {n: r.status for n, r in results.items()} == {"gpu001": OK, "gpu002": OK,
                                                         "gpu003": WARN}
    # The VBIOS differ on all three (three GPU models): no majority, not reported.
    assert results["gpu003"].reason == "driver 550.90.12 (2/3 nodes of the job have 550.127.05)"
    strict = _job(tmp_path / "strict", version_skew_fail=True)
    for name, expect in strict.items():
        versions.collect(name, expect, 5, "prolog", "gpu[001-003]")
    inv = versions.collect("gpu003", strict["gpu003"], 5, "check", "gpu[001-003]")
    assert versions.check_drift(inv, strict["gpu003"], Context("prolog", "gpu003")).status \
        == FAIL


def test_health_check_writes_no_inventory_and_no_dir_means_no_skew_check(tmp_path) -> None:
    expect = _job(tmp_path)["gpu001"]
    inv = versions.collect("gpu001", expect, 5, "check", "gpu[001-003]")
    assert inv.written is None and not (tmp_path / "shared").exists()
    plain = {**expect, "versions_dir": ""}
    result = versions.check_drift(versions.collect("gpu001", plain, 5, "prolog", None), plain,
                                  Context("prolog", "gpu001"))
    assert result.status == OK and result.reason == "no versions_dir configured"


def test_versions_command_prints_the_odd_nodes(tmp_path: Path) -> None:
    for name, expect in _job(tmp_path).items():
        versions.collect(name, expect, 5, "prolog", None)
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "versions",
                           str(tmp_path / "shared")], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    assert proc.returncode == 1, proc.stderr
    assert "gpu003  driver     550.90.12  550.127.05 (2/3)" in proc.stdout
    data = json.loads((tmp_path / "shared" / "gpu003.json").read_text())
    assert data["versions"]["driver"] == "550.90.12"


def test_registered_with_an_info_metric(tmp_path: Path) -> None:
    names = [s.name for s in runner.registry()]
    assert names.count("node.versions") == 1 and names.count("node.version_skew") == 1
    expect = expect_for(tmp_path, "h200-550-q.txt", "ibstat-cx6dx-l2fwdnv6.txt")
    result = versions.check_pins(versions.collect_local("gpu001", expect, 5), expect,
                                 Context("prolog", "gpu001"))
    labels = {m.labels for m in result.metrics}
    assert (("component", "driver"), ("version", "550.90.12")) in labels
    assert (("component", "hca_fw:22"), ("version", "22.32.2004")) in labels


@pytest.mark.parametrize(("pins", "message"), [
    ({"firmware": "1"}, "versions.'firmware' is not a component"),
    ({"driver": 550}, "versions.driver = 550 should be a version string"),
    ("550", "versions should be a table"),
])
def test_pins_are_checked_at_load(pins, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve({"nodes": [{"versions": pins}]}, "gpu001", None)


def test_hung_tools_share_one_deadline(tmp_path: Path) -> None:
    """nvidia-smi and ofed_info both hang: the inventory still comes back within about one
    deadline, saying what it could not read; the firmware and kernel are still there."""
    import time

    expect = expect_for(tmp_path, "h200-550-q.txt", "ibstat-cx6dx-l2fwdnv6.txt")
    hang = tmp_path / "hang-tool"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    expect.update(nvidia_smi=str(hang), ofed_info=str(hang))
    start = time.monotonic()
    inv = versions.collect_local("gpu001", expect, 1.0)
    assert time.monotonic() - start < 2.0
    assert "did not return" in inv.unread["cuda"] and "did not return" in inv.unread["ofed"]
    assert inv.versions["hca_fw"] == {"mlx5_0": "22.32.2004", "mlx5_1": "22.32.2004"}


def test_the_prolog_drains_on_a_pinned_driver_and_leaves_its_inventory(tmp_path) -> None:
    """End to end through 'health prolog': the HGX fixture node against a pin of 550.54.15,
    with every other check passing. The kernel module's version (/proc/driver/nvidia/version
    of the fake tree, 535.104.05) is the driver's; nvidia-smi's header only fills in."""
    shared = tmp_path / "shared"
    cfg = write_config(tmp_path / "health.toml", tmp_path / "state", [hgx_node(
        "gpu007", "h100-535-healthy", h100_tree(tmp_path / "root"),
        versions={"driver": "550.54.15"}, versions_dir=str(shared))])
    env = fake_slurm(tmp_path, {"gpu007": ("IDLE", "")})
    env.update(SLURMFABRIC_HEALTH_CONFIG=str(cfg), SLURMD_NODENAME="gpu007",
               SLURM_JOB_ID="41", SLURM_JOB_NODELIST="gpu[007-008]")
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "prolog"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_NODE_BAD, proc.stderr
    assert slurm_nodes(env)["gpu007"]["reason"] == (
        "slurmfabric: node.versions: driver 535.104.05 (pinned 550.54.15)")
    saved = json.loads((shared / "gpu007.json").read_text())
    assert saved["versions"]["driver"] == "535.104.05"
    assert saved["versions"]["hca_fw"]["mlx5_0"] == "28.39.1002"
    prom = (tmp_path / "state" / "gpu007.prom").read_text()
    assert ('slurmfabric_node_version_info{node="gpu007",component="driver",'
            'version="535.104.05"} 1') in prom


# -- NCCL: the library a job loads (issue 46, item 5) ----------------------------------------

NCCL_H = (Path(__file__).resolve().parents[1] / "fixtures" / "health" / "ncclwheel"
          / "nvidia_nccl_cu13-2.30.7_nccl.h-lines-1-26.txt")


def _wheel(site: Path, header: bool = True) -> Path:
    """The nvidia-nccl-cu13 2.30.7 wheel as pip lays it out (its RECORD, ncclwheel/SOURCES.md):
    the library without X.Y.Z in its name, the header beside it, the dist-info."""
    lib = site / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"\x7fELF")
    if header:
        (site / "nvidia" / "nccl" / "include").mkdir()
        (site / "nvidia" / "nccl" / "include" / "nccl.h").write_bytes(NCCL_H.read_bytes())
    (site / "nvidia_nccl_cu13-2.30.7.dist-info").mkdir()
    return lib / "libnccl.so.2"


def test_nccl_version_from_the_wheel_a_job_loads(tmp_path: Path) -> None:
    """Before: only libnccl.so.X.Y.Z in system directories; the torch wheel's NCCL was
    unseen and an older system NCCL was reported as the job's."""
    site = tmp_path / "venv/lib/python3.11/site-packages"
    lib = _wheel(site)
    system = tmp_path / "usr/lib/x86_64-linux-gnu"
    system.mkdir(parents=True)
    (system / "libnccl.so.2.18.3").write_bytes(b"")
    assert versions.nccl_version_of(str(lib)) == "2.30.7"  # from nccl.h's NCCL_MAJOR/MINOR/PATCH
    found = versions.find_nccl(str(tmp_path), ["/venv/lib/python3.11/site-packages",
                                               "/usr/lib/x86_64-linux-gnu"])
    assert found == (str(lib), "2.30.7")
    expect = {"sysfs_root": str(tmp_path), "ofed_info": str(tmp_path / "none"),
              "nccl_lib_dirs": ["/venv/lib/python3.11/site-packages", "/usr/lib/x86_64-linux-gnu"]}
    inv = versions.collect_local("gpu001", expect, 5, gpus=False)
    assert inv.versions["nccl"] == "2.30.7"


def test_nccl_version_from_dist_info_a_symlink_or_said_unknown(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    lib = _wheel(site, header=False)
    assert versions.nccl_version_of(str(lib)) == "2.30.7"  # the dist-info's name
    image = tmp_path / "image/usr/lib/x86_64-linux-gnu"  # a container's Debian package
    image.mkdir(parents=True)
    (image / "libnccl.so.2.21.5").write_bytes(b"")
    (image / "libnccl.so.2").symlink_to("libnccl.so.2.21.5")
    assert versions.nccl_version_of(str(image / "libnccl.so.2")) == "2.21.5"
    lone = tmp_path / "opt/lib"
    lone.mkdir(parents=True)
    (lone / "libnccl.so.2").write_bytes(b"")
    expect = {"sysfs_root": str(tmp_path), "ofed_info": str(tmp_path / "none"),
              "nccl_lib_dirs": ["/opt/lib"]}
    inv = versions.collect_local("gpu001", expect, 5, gpus=False)
    assert "nccl" not in inv.versions
    assert inv.unread["nccl"].endswith("libnccl.so.2: version unknown (no nccl.h, wheel "
                                       "metadata or X.Y.Z name)")
    expect["nccl_lib_dirs"] = ["/nowhere"]
    assert versions.collect_local("gpu001", expect, 5, gpus=False).unread["nccl"].startswith(
        "no libnccl.so in a Python environment's nvidia/nccl/lib")
