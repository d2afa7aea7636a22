"""Parsers of Slurm command output, on recorded real output shapes."""

from __future__ import annotations

import pytest

from slurmfabric.errors import SlurmCommandError, SubmitError
from slurmfabric.slurm import cmd as slurmcmd


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
    parsed = slurmcmd.parse_parsable_jobid(text)
    assert (parsed.job_id, parsed.cluster) == (job_id, cluster)


@pytest.mark.parametrize("text", ["", "Submitted batch job 12\n", "abc;x"])
def test_parse_parsable_jobid_rejects_garbage(text):
    with pytest.raises(SubmitError):
        slurmcmd.parse_parsable_jobid(text)


def test_show_oneliner_keeps_spaces_in_reason():
    # Shape of `scontrol show -o node` on Slurm 22.05 (fields trimmed).
    line = (
        "NodeName=sfn3 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE+DRAIN "
        "ThreadsPerCore=1 Reason=slurmfabric: rdma: mlx5_0:1 at 200 Gb/s, expected 400 "
        "[root@2026-11-29T08:40:01] Comment=(null)"
    )
    rec = slurmcmd.parse_show_oneliner(line)
    assert rec["NodeName"] == "sfn3"
    assert rec["State"] == "IDLE+DRAIN"
    assert rec["Reason"] == (
        "slurmfabric: rdma: mlx5_0:1 at 200 Gb/s, expected 400 [root@2026-11-29T08:40:01]"
    )
    assert rec["Comment"] == "(null)"


def test_node_state_flags():
    assert slurmcmd.node_state_flags("IDLE+DRAIN") == {"IDLE", "DRAIN"}
    assert slurmcmd.node_state_flags("down*") == {"DOWN", "NOT_RESPONDING"}


def test_run_quotes_stderr_verbatim():
    with pytest.raises(SlurmCommandError) as info:
        slurmcmd.run(["sh", "-c", "echo 'sbatch: error: Batch job submission failed: "
                      "Invalid partition name specified' >&2; exit 1"])
    assert "Invalid partition name specified" in str(info.value)


def test_run_missing_binary_has_hint():
    with pytest.raises(SlurmCommandError) as info:
        slurmcmd.run(["definitely-not-sbatch-xyz"])
    assert "command not found" in str(info.value)
    assert info.value.hint
