"""``jobs diagnose`` against real processes: 4 local torch "ranks" in a gloo all_reduce
loop (tests/progress_rank.py), the per-node collector run directly (no srun), py-spy."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cleanenv import clean_env
from flightdump import fr_dump

from slurmfabric.progress import diagnose, flight
from slurmfabric.progress.collect import pyspy_path
from slurmfabric.progress.watch import read_beats

ROOT = Path(__file__).resolve().parents[2]
RANK = ROOT / "tests" / "progress_rank.py"

def _require_pyspy() -> None:
    """py-spy is the 'diagnose' extra, which scripts/test.sh installs: missing is a failure."""
    assert pyspy_path() is not None, "py-spy missing: pip install -e '.[diagnose]'"


needs_pyspy = pytest.mark.usefixtures("_pyspy")


@pytest.fixture
def _pyspy() -> None:
    _require_pyspy()


def start_ranks(tmp_path: Path, job: str, extra: dict[int, list[str]]) -> list[subprocess.Popen]:
    procs = []
    errors = (tmp_path / "ranks.err").open("w")  # noqa: SIM115 - the children keep it
    for rank in range(4):
        env = clean_env(PATH=os.environ.get("PATH", "/usr/bin:/bin"), PYTHONPATH=str(ROOT),
                        OMP_NUM_THREADS="1", SLURM_JOB_ID=job, RANK=str(rank),
                        LOCAL_RANK=str(rank), WORLD_SIZE="4", SLURMD_NODENAME="node0",
                        SLURMFABRIC_PROGRESS_DIR=str(tmp_path / "beats"))
        procs.append(subprocess.Popen(
            [sys.executable, str(RANK), str(rank), "4", str(tmp_path / "init"),
             *extra.get(rank, [])], env=env, stdout=subprocess.DEVNULL,
            stderr=errors))
    return procs


def wait_for(predicate, what: str, procs, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def ranks(tmp_path):
    started: list[subprocess.Popen] = []
    job = str(random.randrange(10**8, 10**9))  # no other process on this machine has it

    def start(extra):
        started.extend(start_ranks(tmp_path, job, extra))
        return job, started

    yield start
    for p in started:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()


def collect(job: str, node: str = "node0") -> diagnose.Diagnosis:
    env = clean_env(PATH=os.environ.get("PATH", "/usr/bin:/bin"), PYTHONPATH=str(ROOT),
                    SLURMD_NODENAME=node)  # as srun sets it for the collector's task
    done = subprocess.run([sys.executable, "-m", "slurmfabric.progress.collect", job],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    return diagnose.analyse(job, diagnose.parse_output(done.stdout))


@needs_pyspy
def test_a_rank_sleeping_outside_the_collective_is_named(ranks, tmp_path):
    job, procs = ranks({2: ["--sleep-at", "6"]})
    beats = tmp_path / "beats"

    def stalled():
        b = read_beats(str(beats))
        return len(b) == 4 and b[2].step == 5 and all(
            b[r].phase == "comm" and b[r].step == 5 for r in (0, 1, 3))

    wait_for(stalled, "rank 2 to stall at step 6", procs)
    result = collect(job)
    assert [c["rank"] for c in result.culprits] == [2]
    culprit = result.culprits[0]
    assert culprit["pid"] == procs[2].pid and culprit["host"] == "node0"
    assert culprit["why"] == "not in the collective the others wait in"
    line = RANK.read_text().splitlines().index("    time.sleep(3600)") + 1
    assert culprit["frame"] == f"stall (progress_rank.py:{line})"
    assert culprit["step"] == 6
    assert result.waiting_in.startswith("all_reduce called from main (progress_rank.py:")
    assert {tuple(g["ranks"]) for g in result.groups} == {(0, 1, 3), (2,)}
    text = result.text()
    assert f"culprit: rank 2 on node0 (pid {procs[2].pid}): not in the collective" in text
    json.dumps(result.to_dict())
    # another slurmd on the same host (the testbed's nodes) sees these processes but
    # leaves them to node0's collector: each rank is reported once, by its own node
    other = collect(job, node="node1")
    assert other.culprits == [] and not any(g["ranks"] for g in other.groups)


@needs_pyspy
def test_a_stopped_rank_is_named_as_stopped(ranks, tmp_path):
    job, procs = ranks({})
    wait_for(lambda: all((tmp_path / f"init.ready-{r}").exists() for r in range(4)),
             "4 ranks to run 3 steps", procs)
    os.kill(procs[3].pid, signal.SIGSTOP)
    # The others reach the collective rank 3 never joins within a step; on a loaded machine
    # that can take longer than a fixed pause, so collect again until they wait (20 s cap).
    deadline = time.monotonic() + 20
    while True:
        time.sleep(0.5)
        result = collect(job)
        if [c["rank"] for c in result.culprits] == [3] or time.monotonic() > deadline:
            break
    stopped = [c for c in result.culprits if c["state"] == "T"]
    assert [(c["rank"], c["pid"]) for c in stopped] == [(3, procs[3].pid)]
    assert stopped[0]["why"] == "process stopped (SIGSTOP)" and stopped[0]["frame"]
    assert [c["rank"] for c in result.culprits] == [3]  # the waiting ones are not culprits
    assert "all_reduce" in (result.waiting_in or "")


def test_a_killed_rank_is_gone_and_the_srun_step_is_one_overlap_step():
    records = [{"kind": "rank", "rank": r, "pid": 10 + r, "host": "n0", "state": "S",
                "world": "3", "threads": [{"name": "MainThread", "frames": [
                    {"name": "all_reduce", "file": "/x/torch/distributed/distributed_c10d.py",
                     "line": 1}, {"name": "train", "file": "/w/train.py", "line": 9}]}]}
               for r in (0, 2)]
    records.append({"kind": "node", "host": "n0", "beats": {"1": {"rank": 1, "step": 4,
                                                                  "host": "n1", "pid": 77}}})
    result = diagnose.analyse("5", records)
    assert [(c["rank"], c["host"], c["pid"], c["state"]) for c in result.culprits] == [
        (1, "n1", 77, "gone")]
    line = json.dumps(records[0])
    assert diagnose.parse_output(f"0: {line}\nnoise\n{line}") == [records[0], records[0]]


def test_flight_recorder_dumps_name_the_rank_behind_and_refuse_code(tmp_path):
    for rank, seq in ((0, 12), (1, 11), (2, 12)):
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(fr_dump(seq, "started")))

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    (tmp_path / "nccl_trace_rank_3").write_bytes(pickle.dumps({"entries": [Evil()]}))
    dumps = flight.collect(str(tmp_path / "nccl_trace_rank_"))
    assert not (tmp_path / "pwned").exists()
    assert "refused" in dumps[3]["error"]
    assert dumps[1]["groups"]["0"]["last_enqueued"] == 11
    result = diagnose.analyse("9", [{"kind": "node", "host": "n0", "flight": dumps}])
    behind = [f for f in result.flight if f.get("group") == "0"]
    assert [(f["rank"], f["last"], f["others"]) for f in behind] == [(1, 11, 12)]


def test_the_collector_says_when_py_spy_is_missing(monkeypatch):
    from slurmfabric.progress import collect as collector

    monkeypatch.setattr(collector, "pyspy_path", lambda: None)
    ranks, node = collector.collect("0")  # Slurm job ids start at 1: no process has 0
    assert ranks == [] and "pip install 'slurmfabric[diagnose]'" in node["error"]
    result = diagnose.analyse("0", [node])
    assert "py-spy is not installed" in result.text()


def test_cli_runs_one_srun_step_and_prints_the_culprit(tmp_path, monkeypatch):
    frames = [{"name": "all_reduce", "file": "/v/torch/distributed/distributed_c10d.py",
               "line": 3}, {"name": "train", "file": "/w/train.py", "line": 40}]
    lines = [{"kind": "rank", "rank": r, "pid": 100 + r, "host": f"n{r // 2}", "state": "S",
              "world": "4", "threads": [{"name": "MainThread", "frames": frames}]}
             for r in (0, 1, 3)]
    lines.append({"kind": "rank", "rank": 2, "pid": 102, "host": "n1", "state": "D",
                  "world": "4", "threads": [{"name": "MainThread", "frames": [
                      {"name": "read", "file": "/w/data.py", "line": 7}]}]})
    (tmp_path / "out").write_text("".join(f"{i % 2}: {json.dumps(x)}\n"
                                          for i, x in enumerate(lines)))
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text('#!/bin/sh\nprintf "%s\\n" "$*" > "$FAKE_DIR/argv"\ncat "$FAKE_DIR/out"\n')
    srun.chmod(0o755)
    env = {**os.environ, "PATH": f"{srun.parent}:{os.environ['PATH']}",
           "FAKE_DIR": str(tmp_path), "SLURMFABRIC_JOBS_DIR": str(tmp_path / "records")}
    run = [sys.executable, "-m", "slurmfabric", "jobs", "diagnose", "5;c2"]
    text = subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout
    assert "culprit: rank 2 on n1 (pid 102): process in uninterruptible sleep" in text
    assert "at read (data.py:7)" in text
    assert (tmp_path / "argv").read_text().startswith(
        "--overlap --jobid=5 --clusters=c2 --ntasks-per-node=1")
    data = json.loads(subprocess.run([*run, "--json"], env=env, capture_output=True,
                                     text=True, check=True).stdout)
    assert [(c["rank"], c["state"]) for c in data["culprits"]] == [(2, "D")]


def test_the_collector_step_runs_one_task_per_node_of_the_job(tmp_path):
    """Inside the batch shell srun would take SLURM_NTASKS (the job's 4 ranks) for the
    collector step: two collectors per node, each rank named twice. The step gets the
    job's node count from scontrol instead."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\necho "JobId=5 JobState=RUNNING NumNodes=2 NumTasks=4 NodeList=n[0-1]"\n')
    (bin_dir / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$*" > "$FAKE_DIR/argv"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
           "SLURM_NTASKS": "4", "SLURM_JOB_ID": "5"}
    diagnose.diagnose("5", env=env)
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:5] == ["--overlap", "--jobid=5", "--nodes=2", "--ntasks=2",
                        "--ntasks-per-node=1"]


# -- records of any size, child processes, the asynchronous path (issue 45) -----------------

FIXTURES = ROOT / "tests" / "fixtures" / "pyspy"


def srun_label(task: int, text: str) -> str:
    """What srun --label makes of one task's output: each line cut into pieces of at most
    1024 bytes, every piece its own labelled line (issue 45: a 3 KiB record arrived as
    three lines on the testbed, none of which parsed)."""
    out = []
    for line in text.splitlines():
        out += [f"{task}: {line[i:i + 1024]}" for i in range(0, max(len(line), 1), 1024)]
    return "\n".join(out) + "\n"


def test_records_of_any_size_survive_srun_cutting_lines():
    from slurmfabric.progress import frames

    deep = [{"name": f"layer_{i}", "file": f"/w/model/block_{i}.py", "line": i}
            for i in range(600)]  # ~ 40 KiB of frames
    records = [{"kind": "rank", "rank": r, "pid": 10 + r, "host": f"n{r}", "state": "S",
                "world": "2", "threads": [{"name": "MainThread", "frames": deep}]}
               for r in (0, 1)]
    texts = [json.dumps(r, sort_keys=True) for r in records]
    assert len(texts[0]) > 30_000
    # the old channel: one JSON line per record, cut by srun, lost
    assert diagnose.parse_output(srun_label(0, texts[0])) == []
    # framed: two tasks' pieces interleaved line by line, as srun merges them
    streams = [srun_label(task, "\n".join(frames.frame(text)))
               for task, text in enumerate(texts)]
    mixed = [line for pair in zip(*(s.splitlines() for s in streams)) for line in pair]
    assert max(len(line) for line in mixed) < 1024
    got = diagnose.parse_output("noise\n" + "\n".join(mixed) + "\n")
    assert sorted(got, key=lambda r: r["rank"]) == records
    # a record with a piece missing is dropped whole, never half read
    lines = streams[0].splitlines()
    assert diagnose.parse_output("\n".join(lines[:3] + lines[4:])) == []


def pyspy_record(rank: int, fixture: str, *, native: bool = True) -> dict:
    from slurmfabric.progress.collect import threads_from_pyspy

    raw = json.loads((FIXTURES / fixture).read_text())
    threads = threads_from_pyspy(raw, raw[0]["os_thread_id"])
    if not native:  # what py-spy shows without --native: the Python frames only
        for thread in threads:
            thread["frames"] = [f for f in thread["frames"] if f["file"].endswith(".py")]
    return {"kind": "rank", "rank": rank, "pid": 100 + rank, "host": f"n{rank // 2}",
            "state": "S", "world": "4", "threads": threads}


@pytest.mark.parametrize(("waiting", "where"), [
    ("async-wait-native.json", "c10d::Work::wait called from main (progress_rank.py:85)"),
    ("ddp-backward-native.json",
     "_engine_run_backward called from main (progress_rank.py:79)")])
def test_the_others_waiting_at_a_synchronisation_name_the_culprit(waiting, where):
    """Stacks recorded with py-spy 0.4.3 --native on torch 2.13.0+cpu, gloo
    (tests/progress_rank.py --mode async|ddp, rank 1 of 2 stalled 12 frames deep)."""
    records = [pyspy_record(r, waiting) for r in (0, 1, 2)]
    records.append(pyspy_record(3, "stall-depth12-native.json"))
    result = diagnose.analyse("7", records)
    assert result.waiting_in == where
    assert [(c["rank"], c["host"]) for c in result.culprits] == [(3, "n1")]
    culprit = result.culprits[0]
    assert culprit["why"] == "not at the synchronisation the others wait at"
    assert culprit["frame"] == "stall (progress_rank.py:33)"  # Python's, not clock_nanosleep
    text = result.text()
    assert "culprit: rank 3 on n1 (pid 103)" in text and "no culprit" not in text


def test_without_native_frames_most_ranks_standing_together_are_the_waiters():
    records = [pyspy_record(r, "async-wait-native.json", native=False) for r in (0, 1, 2)]
    records.append(pyspy_record(3, "stall-depth12-native.json", native=False))
    result = diagnose.analyse("7", records)
    assert result.waiting_in == "main (progress_rank.py:85)"
    assert [c["rank"] for c in result.culprits] == [3]
    # two against two: no majority, no guess
    records[2] = pyspy_record(2, "stall-depth12-native.json", native=False)
    split = diagnose.analyse("7", records)
    assert split.culprits == [] and split.waiting_in is None
    assert "no culprit: the ranks are in 2 places and none holds most of them" in split.text()


@needs_pyspy
def test_loader_workers_are_not_ranks_and_a_deep_stall_is_named(ranks, tmp_path):
    """4 ranks, each with 2 DataLoader worker processes (which inherit RANK), rank 2
    stalled 14 frames deep: 4 ranks found, the workers listed as their children."""
    job, procs = ranks({r: ["--workers", "2", "--depth", "14"]
                        + (["--sleep-at", "6"] if r == 2 else []) for r in range(4)})
    beats = tmp_path / "beats"

    def stalled():
        b = read_beats(str(beats))
        return len(b) == 4 and b[2].step == 5 and all(
            b[r].phase == "comm" and b[r].step == 5 for r in (0, 1, 3))

    wait_for(stalled, "rank 2 to stall at step 6", procs, timeout=120)
    env = clean_env(PATH=os.environ.get("PATH", "/usr/bin:/bin"), PYTHONPATH=str(ROOT),
                    SLURMD_NODENAME="node0")
    done = subprocess.run([sys.executable, "-m", "slurmfabric.progress.collect", job],
                          env=env, capture_output=True, text=True, timeout=120, check=True)
    records = diagnose.parse_output(srun_label(0, done.stdout))  # as srun --label hands it
    found = [r for r in records if r["kind"] == "rank"]
    assert sorted((r["rank"], r["pid"]) for r in found) == [(r, p.pid)
                                                           for r, p in enumerate(procs)]
    assert all(len(r["children"]) == 2 for r in found), [r["children"] for r in found]
    assert max(len(json.dumps(r)) for r in found) > 1024  # it would have been cut
    result = diagnose.analyse(job, records)
    assert [(c["rank"], c["pid"]) for c in result.culprits] == [(2, procs[2].pid)]
    assert result.culprits[0]["frame"].startswith("stall (progress_rank.py:")


def test_diagnose_runs_one_overlap_step_through_a_real_srun_binary(tmp_path):
    """Fake scontrol and srun on PATH (no cluster here): the step gets the job's node count
    from scontrol, one task per node, the cluster, and the collector after '--'; a failed
    task's non-zero exit still returns what the other nodes printed."""
    record = {"kind": "rank", "rank": 0, "pid": 10, "host": "n0", "state": "R", "world": "1",
              "threads": []}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\necho 'JobId=5 JobName=train JobState=RUNNING NumNodes=3 NumCPUs=6'\n")
    (bin_dir / "srun").write_text(
        f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/argv\n"
        f"echo '0: {json.dumps(record)}'\necho 'srun: error: n2: task 2: Exited' >&2\nexit 1\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = diagnose.diagnose("5", cluster="c2", env=env, timeout=30)
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:4] == ["--overlap", "--jobid=5", "--clusters=c2", "--nodes=3"]
    assert "--ntasks=3" in argv and "--ntasks-per-node=1" in argv
    assert argv[argv.index("--") + 1:] == [sys.executable, "-m",
                                           "slurmfabric.progress.collect", "5"]
    assert [view.rank for view in result.ranks] == [0]
