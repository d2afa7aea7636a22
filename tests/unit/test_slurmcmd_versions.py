"""slurm/cmd.py's parsers on real output recorded from Slurm 22.05.8 (Debian 12) and 24.11.5
(Debian 13), so a format change between the two shows up here without a cluster.

slurm22/: recorded from the running testbed on Debian 12. slurm24/: recorded from the same
testbed code run inside a Debian 13 chroot (nodes sft1..sft4 on 127.0.80.x).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmfabric.errors import SlurmCommandError
from slurmfabric.slurm import cmd

FIXTURES = Path(__file__).parent.parent / "fixtures"
VERSIONS = {
    "slurm22": ((22, 5, 8), "sfn", "127.0.77."),
    "slurm24": ((24, 11, 5), "sft", "127.0.80."),
}
OS_FIELD = "Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0"


def read(version: str, name: str) -> str:
    return (FIXTURES / version / name).read_text()


def record(version: str, name: str) -> dict[str, str]:
    (line,) = [x for x in read(version, name).splitlines() if "=" in x]
    return cmd.parse_show_oneliner(line)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_version_lines_of_client_and_daemon(version):
    expected = VERSIONS[version][0]
    assert cmd.parse_version(read(version, "scontrol_version.txt")) == expected
    assert cmd.parse_version(read(version, "slurmd_V.txt")) == expected


def test_parse_version_rejects_text_without_version():
    with pytest.raises(SlurmCommandError, match="cannot read a Slurm version"):
        cmd.parse_version("scontrol: fatal: Could not establish a configuration source")


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_idle_node_record(version):
    expected, prefix, addr = VERSIONS[version]
    node = record(version, "show_node_idle.txt")
    assert node["NodeName"] == f"{prefix}1"
    assert node["NodeAddr"] == f"{addr}1"
    assert node["NodeHostName"] == f"{prefix}1"
    assert node["State"] == "IDLE"
    assert cmd.node_state_flags(node["State"]) == {"IDLE"}
    assert node["Version"] == ".".join(f"{p:02d}" if i == 1 else str(p)
                                       for i, p in enumerate(expected))
    assert node["OS"] == OS_FIELD  # a value with spaces and '#' stays whole
    assert node["CfgTRES"] == "cpu=4,mem=4000M,billing=4"  # '=' inside a value
    assert node["AllocTRES"] == ""  # empty value followed by the next key
    assert node["Partitions"] == "debug"
    assert "Reason" not in node


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_completed_job_record(version):
    _, prefix, _ = VERSIONS[version]
    job = record(version, "show_job_completed.txt")
    assert job["JobState"] == "COMPLETED"
    assert job["JobState"] in cmd.FINAL_STATES
    assert job["NodeList"] == f"{prefix}[1-2]"
    assert job["BatchHost"] == f"{prefix}1"
    assert job["NumNodes"] == "2"
    assert job["ExitCode"] == "0:0"
    assert job["StdOut"].startswith("/") and job["StdOut"].endswith(f"-{job['JobId']}.out")
    # keys with ':' and '/' in them
    assert job["AllocNode:Sid"].startswith("localhost:")
    assert job["ReqB:S:C:T"] == "0:0:*:*"
    assert job["CPUs/Task"] in {"1", "2"}


def test_job_tres_keys_differ_between_versions():
    """22.05 prints TRES=, 24.11 ReqTRES= and AllocTRES=: read neither without a fallback."""
    old = record("slurm22", "show_job_completed.txt")
    new = record("slurm24", "show_job_completed.txt")
    assert "TRES" in old and "AllocTRES" not in old
    assert new["AllocTRES"] == "cpu=2,node=2,billing=2" and "TRES" not in new
    assert old["Power"] == ""  # 22.05's last field is empty


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_sinfo_node_states(version):
    _, prefix, _ = VERSIONS[version]
    states = cmd.parse_node_states(read(version, "sinfo_N_T.txt"))
    assert states == {f"{prefix}{i}": "idle" for i in range(1, 5)}


def test_sinfo_node_states_rejects_other_formats():
    with pytest.raises(SlurmCommandError, match="unexpected sinfo line"):
        cmd.parse_node_states(read("slurm24", "sinfo.txt"))


def test_24_drained_node_keeps_reason_with_spaces_and_port():
    node = record("slurm24", "show_node_drained.txt")
    assert node["State"] == "IDLE+DRAIN"
    assert cmd.node_state_flags(node["State"]) == {"IDLE", "DRAIN"}
    assert node["Reason"] == (
        "slurmfabric: ib: mlx5_0 port 1 at 200 Gb/s (want 400) [root@2026-11-29T09:09:27]")
    assert node["Port"] == "19904"  # 24.11 prints Port= only where it differs from SlurmdPort
    assert node["AveWatts"] == "0"  # the field before the double space and Reason
    assert cmd.parse_node_states(read("slurm24", "sinfo_N_T_drained.txt"))["sft4"] \
        == "drained"


def test_24_resumed_node_is_not_responding_until_slurmd_pings():
    """Right after State=RESUME 24.11 shows IDLE+NOT_RESPONDING (sinfo: idle*) and the old
    reason for a moment, so callers must poll for plain idle."""
    node = record("slurm24", "show_node_after_resume.txt")
    assert node["State"] == "IDLE+NOT_RESPONDING"
    assert cmd.node_state_flags(node["State"]) == {"IDLE", "NOT_RESPONDING"}
    assert node["Reason"].startswith("probe [root@")
    states = cmd.parse_node_states(read("slurm24", "sinfo_N_T_after_resume.txt"))
    assert states["sft3"] == "idle*"
    assert cmd.node_state_flags(states["sft3"].upper()) == {"IDLE", "NOT_RESPONDING"}


def test_24_all_nodes_and_running_job():
    lines = [x for x in read("slurm24", "show_node_all.txt").splitlines() if "=" in x]
    nodes = [cmd.parse_show_oneliner(x) for x in lines]
    assert [n["NodeName"] for n in nodes] == ["sft1", "sft2", "sft3", "sft4"]
    assert len({n["NodeAddr"] for n in nodes}) == 4
    running = record("slurm24", "show_job_running.txt")
    assert running["JobState"] == "RUNNING"
    assert running["JobState"] not in cmd.FINAL_STATES
    assert running["EndTime"] == "Unknown"
    alloc = record("slurm24", "show_node_alloc.txt")
    assert alloc["State"] == "MIXED" and alloc["AllocTRES"] == "cpu=1"
    cancelled = record("slurm24", "show_job_cancelled.txt")
    assert cancelled["JobState"] == "CANCELLED" and cancelled["ExitCode"] == "0:15"


def test_24_sbatch_and_two_node_output():
    job = cmd.parse_parsable_jobid(read("slurm24", "sbatch_parsable.txt"))
    assert job.job_id == "1" and job.cluster is None
    names = sorted(line.split("=", 1)[1] for line in
                   read("slurm24", "two_node_job_output.txt").splitlines())
    assert names == ["sft1", "sft2"]
