"""slurmfabric jobs: ids, records, status from slurmctld then accounting, and the failure
summary read from Slurm's own lines.

The Slurm commands are recording stand-ins on PATH here; the same paths against the real
testbed (with slurmdbd and MariaDB) are in tests/cluster/test_jobs_cluster.py. The srun
and slurmstepd lines below were recorded on the testbed (Slurm 22.05.8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmfabric.errors import SlurmCommandError, UsageError
from slurmfabric.job.follow import Job, Record, load_records, parse_job_id, save_record, summarize

# From a 2-node srun job on the testbed where task 3 exited 7 and srun killed the rest.
RANK_EXIT = """\
rank 0 step 1
rank 3 step 1
srun: error: sfn2: task 3: Exited with exit code 7
srun: launch/slurm: _step_signal: Terminating StepId=41.0
slurmstepd-sfn1: error: *** STEP 41.0 ON sfn1 CANCELLED AT 2026-12-01T15:30:02 ***
srun: error: sfn1: tasks 0-1: Exited with exit code 143
srun: error: sfn2: task 2: Killed
"""


@pytest.mark.parametrize(("text", "parsed"), [
    ("123", ("123", None)), ("123;c1", ("123", "c1")), ("123_4", ("123_4", None)),
    ("123+1", ("123+1", None))])
def test_job_ids_with_cluster_array_and_het_parts(text, parsed) -> None:
    assert parse_job_id(text) == parsed


@pytest.mark.parametrize("bad", ["", "12a", "-1", "123;", "1;c d", "123_x", "123 --all"])
def test_bad_job_ids_are_refused(bad) -> None:
    with pytest.raises(UsageError):
        parse_job_id(bad)


def test_summary_names_the_first_failing_rank_not_the_ones_srun_killed() -> None:
    s = summarize("41", "FAILED", "7:0", RANK_EXIT)
    assert (s.first.rank, s.first.node, s.first.what, s.first.exit_code) == (
        3, "sfn2", "exit code 7", 7)
    assert [(f.rank, f.what) for f in s.failures] == [
        (3, "exit code 7"), (0, "exit code 143"), (1, "exit code 143"), (2, "Killed")]
    assert s.cancelled and "CANCELLED AT" in s.cancelled[0]
    text = s.text()
    assert text.splitlines()[:2] == ["job 41 FAILED (exit 7:0)",
                                     "first failure: rank 3 on sfn2: exit code 7"]


def test_summary_reports_oom_nccl_and_drains() -> None:
    nccl = (Path(__file__).parents[1] / "fixtures" / "nccl" /
            "nccl-2.19.3-socket-fallback.log").read_text()
    output = nccl + ("slurmstepd: error: Detected 1 oom_kill event in StepId=9.0. Some of the "
                     "step tasks have been OOM Killed.\n"
                     "srun: error: sfn1: task 0: Out Of Memory\n")
    s = summarize("9", "OUT_OF_MEMORY", "0:125", output,
                  drains={"sfn1": "slurmfabric: gpu.ecc: 3 uncorrected"})
    assert s.first.what == "Out Of Memory" and s.oom
    assert any("socket_fallback" in line for line in s.nccl)
    assert "drained by slurmfabric: sfn1: slurmfabric: gpu.ecc: 3 uncorrected" in s.text()
    assert s.to_dict()["first"]["rank"] == 0


def test_records_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMFABRIC_JOBS_DIR", str(tmp_path))
    save_record(Record(job_id="5", name="a", submitted=2.0), "#!/bin/bash\n")
    save_record(Record(job_id="6", cluster="c1", name="b", submitted=1.0), "#!/bin/bash\n")
    (tmp_path / "junk.json").write_text("{not json")
    assert [r.key for r in load_records()] == ["6;c1", "5"]
    assert Path(load_records()[0].script).read_text() == "#!/bin/bash\n"


FAKE = r"""#!/bin/sh
printf '%s\n' "$(basename "$0") $*" >> "$FAKE_SLURM/calls"
case "$(basename "$0")" in
  scontrol) if [ -f "$FAKE_SLURM/show" ]; then cat "$FAKE_SLURM/show"; else
              echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; fi ;;
  sacct) if [ -f "$FAKE_SLURM/sacct_error" ]; then cat "$FAKE_SLURM/sacct_error" >&2; exit 1; fi
         cat "$FAKE_SLURM/sacct" ;;
  scancel) ;;
esac
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "slurm"
    bin_dir.mkdir()
    state.mkdir()
    for name in ("scontrol", "sacct", "scancel"):
        (bin_dir / name).write_text(FAKE)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(state))
    monkeypatch.setenv("SLURMFABRIC_JOBS_DIR", str(tmp_path / "records"))
    return state


def test_status_comes_from_slurmctld_while_it_knows_the_job(fake: Path) -> None:
    (fake / "show").write_text("JobId=7 JobName=x JobState=RUNNING Reason=None Restarts=1 "
                               "RunTime=00:01:02 NodeList=sfn[1-2] ExitCode=0:0 StdOut=/o/7\n")
    status = Job("7").status()
    assert (status.state, status.nodes, status.restarts, status.source) == (
        "RUNNING", "sfn[1-2]", 1, "slurmctld")
    assert "scontrol show -o job 7" in (fake / "calls").read_text()


def test_status_falls_back_to_accounting(fake: Path) -> None:
    (fake / "sacct").write_text("7|FAILED|7:0|00:00:31|sfn[1-2]|None\n")
    status = Job.from_text("7;c1").status()
    assert (status.state, status.exit_code, status.source) == ("FAILED", "7:0", "sacct")
    calls = (fake / "calls").read_text().splitlines()
    assert calls[-1] == ("sacct --clusters=c1 -j 7 -X -n -P -o "
                         "JobID,State,ExitCode,Elapsed,NodeList,Reason")


def test_no_accounting_says_so_instead_of_guessing(fake: Path) -> None:
    # sacct's own words on a cluster with AccountingStorageType=accounting_storage/none
    (fake / "sacct_error").write_text("sacct: error: Slurm accounting storage is disabled\n")
    with pytest.raises(SlurmCommandError) as caught:
        Job("7").status()
    assert "keeps no accounting" in str(caught.value)
    assert "testbed up --accounting" in caught.value.hint


def test_cli_cancel_and_list_json(fake: Path, tmp_path: Path) -> None:
    env = dict(os.environ)
    run = [sys.executable, "-m", "slurmfabric", "jobs"]
    out = subprocess.run([*run, "cancel", "7", "--signal", "USR2"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout == "job 7: sent USR2\n"
    assert (fake / "calls").read_text().splitlines()[-1] == "scancel --signal=USR2 7"
    save_record(Record(job_id="8", name="n", submitted=1.0), "x")
    listed = subprocess.run([*run, "list", "--json"], env=env, capture_output=True, text=True,
                            check=True)
    assert [r["job_id"] for r in json.loads(listed.stdout)] == ["8"]
    bad = subprocess.run([*run, "status", "7;rm -rf"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "is not one Slurm knows" in bad.stderr
