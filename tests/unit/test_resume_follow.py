"""restart.follow.wait_run: through requeues and chained successors, on scripted records."""

from __future__ import annotations

import pytest

from slurmfabric.errors import SlurmCommandError
from slurmfabric.restart import follow
from slurmfabric.slurm import cmd


def script(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[dict[str, str]]]) -> None:
    """Each job id answers its records in turn (the last one from then on)."""
    def job(job_id: str, env: object = None, cluster: object = None) -> dict[str, str]:
        seen = answers[job_id]
        return seen.pop(0) if len(seen) > 1 else seen[0]

    monkeypatch.setattr(cmd, "job", job)


def test_a_preempted_job_that_slurm_requeues_is_followed_to_its_end(monkeypatch, tmp_path):
    script(monkeypatch, {"7": [{"JobState": "RUNNING"}, {"JobState": "PREEMPTED", "Requeue": "1"},
                               {"JobState": "PENDING"}, {"JobState": "RUNNING"},
                               {"JobState": "COMPLETED", "ExitCode": "0:0"}]})
    last, record = follow.wait_run("7", str(tmp_path), timeout=10, poll=0)
    assert (last, cmd.job_state(record["JobState"])) == ("7", "COMPLETED")


def test_a_preempted_job_that_stays_so_ends_the_wait(monkeypatch, tmp_path):
    monkeypatch.setattr(follow, "SETTLE", 0)
    script(monkeypatch, {"7": [{"JobState": "PREEMPTED", "Requeue": "1"}]})
    last, record = follow.wait_run("7", str(tmp_path), timeout=10, poll=0)
    assert record["JobState"] == "PREEMPTED"


def test_an_empty_state_is_polled_again_not_a_crash(monkeypatch, tmp_path):
    script(monkeypatch, {"7": [{"JobState": ""}, {"JobState": "CANCELLED by 0"}]})
    assert follow.wait_run("7", str(tmp_path), timeout=10, poll=0)[1]["JobState"] \
        == "CANCELLED by 0"


def test_the_wait_ends_at_its_timeout(monkeypatch, tmp_path):
    script(monkeypatch, {"7": [{"JobState": "RUNNING"}]})
    with pytest.raises(SlurmCommandError, match="job 7 still RUNNING"):
        follow.wait_run("7", str(tmp_path), timeout=0.05, poll=0.01)
