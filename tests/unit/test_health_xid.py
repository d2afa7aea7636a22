"""gpu.xid: NVIDIA Xid messages from the kernel log, judged by NVIDIA's Xid catalog.

The messages are real, from public bug reports (tests/fixtures/health/xid/kmsg_lines.txt,
each line's source in SOURCES.md). The tests put them into streams in the /dev/kmsg record
format. The device reader itself runs against this machine's real /dev/kmsg.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fake_slurm, hgx_node, scontrol_calls, slurm_nodes, write_config

from slurmfabric._common.probe import ProbeError
from slurmfabric.health.checks import xid
from slurmfabric.health.hookscript import EXIT_NODE_BAD
from slurmfabric.health.model import FAIL, OK, WARN

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "health" / "xid"
LINES = (FIX / "kmsg_lines.txt").read_text().splitlines()
# The Xid of each line of kmsg_lines.txt, read by eye from the published messages.
EXPECTED = [79, 79, 79, 3, 16, 8, 31, 32, 31, 13, 31, 31, 13, 109, 62, 45, 45, 48, 63, 63,
            119, 119, 120, 154, 45, 94, 94, 95, 63]


def stream(path: Path, messages: list[str], first_seq: int = 100) -> Path:
    """A /dev/kmsg-format stream: one record per message, a continuation line after each."""
    records = []
    for i, message in enumerate(messages):
        records.append(f"3,{first_seq + i},{(first_seq + i) * 1000},-;{message}")
        records.append(" SUBSYSTEM=pci")
    path.write_text("\n".join(records) + "\n")
    return path


def test_every_published_line_gives_its_xid_and_gpu() -> None:
    parsed = [xid.parse_xid(line) for line in LINES]
    assert [p["xid"] for p in parsed] == EXPECTED
    assert parsed[0]["pci"] == "0000:2b:00" and parsed[3]["pci"] == "0000:01:00"  # old form
    assert parsed[26]["pci"] == "0000:01:00"  # MIG: "(PCI:0000:01:00 GPU-I:05)"
    assert "caused by previous Xid 149" in parsed[16]["text"]  # the Xid is 45, not 149


def test_the_catalog_copy_in_the_fixtures_is_the_one_the_check_uses() -> None:
    catalog = json.loads((FIX / "catalog.json").read_text())
    assert {int(k): v["immediate_action"] for k, v in catalog.items()} == {
        k: action for k, (_, action) in xid.CATALOG.items()}


def test_first_run_skips_history_then_judges_each_new_message_once(tmp_path: Path) -> None:
    log, cursor = tmp_path / "kmsg", str(tmp_path / "state" / "cursor")
    stream(log, [LINES[0], LINES[9]])  # an old Xid 79 and 13, from before the first run
    first = xid.collect(str(log), cursor)
    assert first["events"] == [] and first["first_run"] and first["history"] == 2
    assert xid.check_xid(first, {}, None).status == WARN
    stream(log, [LINES[0], LINES[9], LINES[1], LINES[12]], first_seq=100)  # two new ones
    second = xid.collect(str(log), cursor)
    assert [(e["xid"], e["seq"]) for e in second["events"]] == [(79, 102), (13, 103)]
    result = xid.check_xid(second, {}, None)
    assert result.status == FAIL
    assert result.reason.startswith("Xid 79 on GPU 0000:10:00 (ROBUST_CHANNEL_GPU_HAS_FALLEN_"
                                    "OFF_THE_BUS, RESTART_BM)")
    assert "Xid 13" not in result.reason  # an application error never drains
    third = xid.collect(str(log), cursor)  # nothing new: no second drain for the same line
    assert third["events"] == [] and xid.check_xid(third, {}, None).status == OK


@pytest.mark.parametrize(("line", "drains"), [
    (LINES[9], False),   # 13 RESTART_APP
    (LINES[15], False),  # 45 WORKFLOW_XID_45
    (LINES[17], True),   # 48 WORKFLOW_XID_48
    (LINES[18], False),  # 63 IGNORE (row remapping is gpu.row_remap's business)
    (LINES[20], True),   # 119 RESET_GPU
    (LINES[25], False),  # 94 contained: RESTART_APP
    (LINES[27], True),   # 95 uncontained: RESET_GPU
    (LINES[23], True),   # 154 recovery action changed to "GPU Reset Required"
    ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset "
     "Required) to 0x0 (None)", False),
    ("NVRM: Xid (PCI:0000:01:00): 999, something new", False),  # unknown: warn only
])
def test_each_xid_follows_nvidias_immediate_action(line: str, drains: bool) -> None:
    event = {**xid.parse_xid(line), "seq": 1, "us": 1}
    result = xid.check_xid({"events": [event]}, {}, None)
    assert result.status == (FAIL if drains else WARN), result.reason


def test_site_overrides_win(tmp_path: Path) -> None:
    e79 = {**xid.parse_xid(LINES[0]), "seq": 1, "us": 1}
    e13 = {**xid.parse_xid(LINES[9]), "seq": 2, "us": 2}
    assert xid.check_xid({"events": [e79]}, {"xid_ignore": [79]}, None).status == WARN
    assert xid.check_xid({"events": [e13]}, {"xid_drain": [13]}, None).status == FAIL


def test_a_reboot_restarts_the_sequence(tmp_path: Path) -> None:
    log, cursor = tmp_path / "kmsg", tmp_path / "cursor"
    cursor.write_text("5000\n")
    stream(log, [LINES[0]], first_seq=3)  # after a reboot the kernel counts from 0 again
    found = xid.collect(str(log), str(cursor))
    assert [e["xid"] for e in found["events"]] == [79] and "reboot" in found["note"]


def test_the_real_kernel_log_is_read_record_by_record(tmp_path: Path) -> None:
    if os.path.exists("/dev/kmsg") and os.access("/dev/kmsg", os.R_OK):
        records, lost = xid._records("/dev/kmsg")
        assert records and lost >= 0
        parsed = [xid.parse_record(r) for r in records]
        assert all(p is not None for p in parsed)  # every record in the kernel's format
        seqs = [p[0] for p in parsed]
        assert seqs == sorted(seqs)
    else:  # a container without the device: an error of the checker, never a drain
        with pytest.raises(ProbeError, match="/dev/kmsg"):
            xid.collect("/dev/kmsg", str(tmp_path / "cursor"))


def test_prolog_drains_once_with_the_gpu_and_xid_named(tmp_path: Path) -> None:
    state, log = tmp_path / "state", tmp_path / "kmsg"
    stream(log, ["NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01"])
    cfg = write_config(tmp_path / "health.toml", state,
                       [hgx_node("gpu007", "h100-535-healthy", None, kmsg_source=str(log))])
    env = fake_slurm(tmp_path, {"gpu007": ("IDLE", "")})
    env.update(SLURMFABRIC_HEALTH_CONFIG=str(cfg), SLURMD_NODENAME="gpu007",
               SLURM_JOB_ID="1001")

    def prolog() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "slurmfabric", "health", "prolog"],
                              env=env, capture_output=True, text=True, timeout=60)

    assert prolog().returncode == 0  # the first run only sets the cursor
    stream(log, ["NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01", LINES[0],
                 LINES[9]], first_seq=100)
    assert prolog().returncode == EXIT_NODE_BAD
    node = slurm_nodes(env)["gpu007"]
    assert node["reason"] == ("slurmfabric: gpu.xid: Xid 79 on GPU 0000:2b:00 (ROBUST_CHANNEL_"
                              "GPU_HAS_FALLEN_OFF_THE_BUS, RESTART_BM): GPU has fallen off the "
                              "bus.")
    drains = len(scontrol_calls(env))
    prolog()  # the same messages again: no second drain
    assert len(scontrol_calls(env)) == drains
