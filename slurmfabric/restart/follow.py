"""Wait for a resumable job on the login node: through its requeues and chained successors.

A requeued job goes back to PENDING under the same id, so its interim states are not its
end. PREEMPTED or NODE_FAIL with ``Requeue=1`` are Slurm on its way to requeue it. A
chained job ends COMPLETED once it has submitted its successor (named in the event log),
and the wait moves on to the successor.
"""

from __future__ import annotations

import time

from slurmfabric.errors import SlurmCommandError
from slurmfabric.restart import events
from slurmfabric.slurm import cmd

ON_THE_WAY_BACK = frozenset({"PREEMPTED", "NODE_FAIL", "REQUEUED", "REQUEUE_HOLD",
                             "REQUEUE_FED"})
SETTLE = 30  # seconds a job in ON_THE_WAY_BACK gets to show up pending again


def _state(record: dict[str, str]) -> str:
    return cmd.job_state(record.get("JobState"))


def successor_of(directory: str, job_id: str) -> str | None:
    """The successor this job submitted before it ended (chain mode), if any."""
    for record in reversed(events.read(directory)):
        if record.get("event") == "end" and str(record.get("job")) == job_id:
            successor = record.get("successor")
            return str(successor) if successor else None
    return None


def wait_run(job_id: str, directory: str, timeout: float, poll: float = 1.0,
             env: dict[str, str] | None = None,
             cluster: str | None = None) -> tuple[str, dict[str, str]]:
    """(the last job id of the run, its final record)."""
    deadline = time.monotonic() + timeout
    current = job_id
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SlurmCommandError(f"job {current} has not ended after {timeout:g} s",
                                    hint=f"scontrol show job {current}")
        record = cmd.wait_job(current, left, poll=poll, env=env, cluster=cluster)
        if _state(record) in ON_THE_WAY_BACK and record.get("Requeue") == "1":
            # Give Slurm up to SETTLE seconds to requeue it; if it does not, this is the end.
            record = cmd.wait_job(
                current, min(SETTLE, deadline - time.monotonic()), poll=poll, env=env,
                cluster=cluster,
                done=lambda state: state not in ON_THE_WAY_BACK, raise_on_timeout=False)
            if _state(record) not in cmd.FINAL_STATES:
                continue  # pending or running again
        successor = successor_of(directory, current)
        if successor and successor != current:
            current = successor
            continue
        return current, record
