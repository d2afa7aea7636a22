"""Parsers of Slurm command output, on recorded real output shapes."""

from __future__ import annotations

import pytest

from slurmfabric.errors import SlurmCommandError, SubmitError
from slurmfabric.slurm import cmd


@pytest.mark.parametrize(
    "text, job_id, cluster",
    [
        ("12345\n", "12345", None),
        ("12345;gpu-cluster\n", "12345", "gpu-cluster"),
        ("sbatch: warning: can't honor --ntasks-per-node\n678\n", "678", None),
        ("123_4\n", "123_4", None),
        ("123+0\n", "123+0", None),
    ],
)
def test_parse_parsable_jobid(text, job_id, cluster):
    parsed = cmd.parse_parsable_jobid(text)
    assert (parsed.job_id, parsed.cluster) == (job_id, cluster)


@pytest.mark.parametrize("text", ["", "Submitted batch job 12\n", "abc;x"])
def test_parse_parsable_jobid_rejects_garbage(text):
    with pytest.raises(SubmitError):
        cmd.parse_parsable_jobid(text)


def test_show_oneliner_keeps_spaces_in_reason():
    # Shape of `scontrol show -o node` on Slurm 22.05 (fields trimmed).
    line = (
        "NodeName=sfn3 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE+DRAIN "
        "ThreadsPerCore=1 Reason=slurmfabric: rdma: mlx5_0:1 at 200 Gb/s, expected 400 "
        "[root@2026-11-29T08:40:01] Comment=(null)"
    )
    rec = cmd.parse_show_oneliner(line)
    assert rec["NodeName"] == "sfn3"
    assert rec["State"] == "IDLE+DRAIN"
    assert rec["Reason"] == (
        "slurmfabric: rdma: mlx5_0:1 at 200 Gb/s, expected 400 [root@2026-11-29T08:40:01]"
    )
    assert rec["Comment"] == "(null)"


def test_node_state_flags():
    assert cmd.node_state_flags("IDLE+DRAIN") == {"IDLE", "DRAIN"}
    assert cmd.node_state_flags("down*") == {"DOWN", "NOT_RESPONDING"}


def test_run_quotes_stderr_verbatim():
    with pytest.raises(SlurmCommandError) as info:
        cmd.run(["sh", "-c", "echo 'sbatch: error: Batch job submission failed: "
                      "Invalid partition name specified' >&2; exit 1"])
    assert "Invalid partition name specified" in str(info.value)


def test_run_missing_binary_has_hint():
    with pytest.raises(SlurmCommandError) as info:
        cmd.run(["definitely-not-sbatch-xyz"])
    assert "command not found" in str(info.value)
    assert info.value.hint


@pytest.mark.parametrize(("value", "state"), [
    ("RUNNING", "RUNNING"),  # scontrol JobState=, squeue %T
    ("CANCELLED by 0", "CANCELLED"),  # sacct State names who cancelled (sacct(1))
    ("CANCELLED by 1000", "CANCELLED"),
    ("", "UNKNOWN"),
    ("   ", "UNKNOWN"),
    (None, "UNKNOWN"),  # the field is missing from the record
])
def test_job_state_is_the_bare_state(value, state):
    assert cmd.job_state(value) == state


def _records(monkeypatch, *records):
    """cmd.job answers these records in turn (the last one from then on)."""
    seen = list(records)
    calls = []

    def job(job_id, env=None, cluster=None):
        calls.append((job_id, cluster))
        return seen.pop(0) if len(seen) > 1 else seen[0]

    monkeypatch.setattr(cmd, "job", job)
    return calls


def test_wait_job_polls_through_an_empty_or_missing_jobstate(monkeypatch):
    """An empty JobState (a record read mid-transition) used to raise IndexError."""
    calls = _records(monkeypatch, {"JobState": ""}, {"JobId": "7"},
                     {"JobState": "CANCELLED by 0", "ExitCode": "0:15"})
    record = cmd.wait_job("7", timeout=5, poll=0)
    assert record["ExitCode"] == "0:15" and len(calls) == 3


def test_wait_job_times_out_naming_the_state_it_saw(monkeypatch):
    _records(monkeypatch, {"JobState": ""})
    with pytest.raises(SlurmCommandError, match=r"job 7 still UNKNOWN after 0 s"):
        cmd.wait_job("7", timeout=0, poll=0)


def test_wait_job_can_wait_for_any_transition_and_give_up_quietly(monkeypatch):
    _records(monkeypatch, {"JobState": "PREEMPTED"})
    record = cmd.wait_job("7", timeout=0, poll=0, done=lambda s: s != "PREEMPTED",
                               raise_on_timeout=False)
    assert record == {"JobState": "PREEMPTED"}
    _records(monkeypatch, {"JobState": "PREEMPTED"}, {"JobState": "PENDING"})
    assert cmd.wait_job("7", timeout=5, poll=0, done=lambda s: s != "PREEMPTED",
                             cluster="c1") == {"JobState": "PENDING"}


def test_job_commands_name_the_cluster_where_given():
    assert cmd.show_command("job", "7", "c1") == ["scontrol", "--clusters=c1", "show",
                                                       "-o", "job", "7"]
    assert cmd.show_command("node") == ["scontrol", "show", "-o", "node"]
    assert cmd.scancel_command("7", "c1", "USR2") == ["scancel", "--clusters=c1",
                                                           "--signal=USR2", "7"]
    assert cmd.scancel_command("7") == ["scancel", "7"]
    assert cmd.sacct_job_command("7")[:5] == ["sacct", "-j", "7", "-X", "-n"]


def test_sacct_rows_pad_short_rows_and_keep_a_reason_whole():
    rows = cmd.parse_sacct_rows("7|CANCELLED by 0|0:15\n\n8|FAILED|1:0|00:01|n1|a|b\n")
    assert rows[0]["State"] == "CANCELLED by 0" and rows[0]["Reason"] == ""
    assert rows[1]["Reason"] == "a|b" and rows[1]["NodeList"] == "n1"
