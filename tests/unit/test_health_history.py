"""Fleet history from slurmdbd's node events: a real sacctmgr recording (Slurm 22.05.8,
tests/fixtures/health/history/README.md) parsed, counted, and printed as text, JSON and a
Prometheus textfile; the command runs a fake sacctmgr on PATH."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

from slurmfabric.health import history
from slurmfabric.slurm import cmd

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "health" / "history" / \
    "sacctmgr_events_22.05.txt"
NOW = dt.datetime(2026, 12, 2, 15, 0, 0).timestamp()


def recorded_events() -> list[history.Event]:
    """The recording through the Slurm layer's parser, as the command reads it."""
    return history.parse_events(cmd.parse_sacct_rows(FIXTURE.read_text(),
                                                     cmd.NODE_EVENT_FIELDS))


def test_events_are_drains_only_and_sorted() -> None:
    events = recorded_events()
    assert [(e.node, e.by) for e in events] == [
            ("fln5", "slurmfabric"), ("fln6", "admin"), ("fln7", "slurmfabric"),
            ("fln7", "slurmfabric"), ("fln7", "slurmfabric"), ("fln8", "slurm")]
    assert all(e.state == "DRAIN" for e in events)  # the cold-start (UNK) rows are skipped
    assert events[0].seconds(NOW) == 1.0 and events[-1].end is None


def test_summary_counts_undos_flaps_resumes_and_lemons() -> None:
    nodes = history.summarize(recorded_events(), NOW, undo_s=30)
    fln5, fln6, fln7, fln8 = (nodes[n] for n in ("fln5", "fln6", "fln7", "fln8"))
    assert (fln5.drains, fln5.undone, fln5.flaps) == (0, 1, 0)  # the breaker-style 1 s drain
    assert (fln6.drains, fln6.resumes, fln6.by, fln6.drained_now) == (1, 1, {"admin": 1}, False)
    # fln7: a 2 s drain (an undo), a 45 s drain resumed, then the lemon drain still open
    assert (fln7.drains, fln7.undone, fln7.resumes, fln7.flaps) == (2, 1, 1, 1)
    assert fln7.lemon and fln7.drained_now
    assert (fln8.by, fln8.lemon, fln8.drained_now) == ({"slurm": 1}, False, True)
    # with a shorter undo window the 2 s drain counts as a drain, and so as a flap
    assert history.summarize(recorded_events(), NOW,
                             undo_s=1)["fln7"].flaps == 2


def test_text_json_and_prometheus() -> None:
    events = recorded_events()
    nodes = history.summarize(events, NOW)
    text = history.as_text(events, nodes, NOW - 3600, NOW, NOW, 30)
    lines = text.splitlines()
    assert "4 drains on 4 nodes, 1 flaps, 1 lemon nodes (fln7)" in lines[0]
    assert lines[2].split()[:7] == ["fln7", "2", "slurmfabric:2", "1", "1", "1", "LEMON"]
    assert any("fln8" in line and "Prolog error" in line for line in lines)
    doc = history.as_json(events, nodes, NOW - 3600, NOW)
    assert doc["lemons"] == ["fln7"] and len(doc["events"]) == 6
    assert doc["events"][-1]["end"] == "-" and doc["events"][-1]["by"] == "slurm"
    prom = history.as_prometheus(nodes, 24)
    assert 'slurmfabric_fleet_lemon{node="fln7"} 1' in prom
    assert 'slurmfabric_fleet_undone{node="fln5"} 1' in prom
    assert 'slurmfabric_fleet_drained{node="fln6"} 0' in prom
    assert prom.count("# TYPE slurmfabric_fleet_") == 6


def _cli(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "sacctmgr"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/argv\n{script}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "slurmfabric", "health", "history", *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_command_reads_sacctmgr_and_writes_the_textfile(tmp_path) -> None:
    prom = tmp_path / "fleet.prom"
    out = _cli(tmp_path, f"cat {FIXTURE}", "--json", "--hours", "48", "--nodes", "fln[5-8]",
               "--prometheus", str(prom))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["lemons"] == ["fln7"]
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:5] == ["-n", "-P", "list", "events", "Event=Node"]
    assert "Nodes=fln[5-8]" in argv and argv[-2] == "Format=" + ",".join(cmd.NODE_EVENT_FIELDS)
    start = dt.datetime.fromisoformat(argv[5].split("=", 1)[1])
    end = dt.datetime.fromisoformat(argv[6].split("=", 1)[1])
    assert abs((end - start).total_seconds() - 48 * 3600) <= 1
    assert 'slurmfabric_fleet_lemon{node="fln7"} 1' in prom.read_text()


def test_command_without_slurmdbd_says_so_in_one_line(tmp_path) -> None:
    out = _cli(tmp_path, "echo ' Problem talking to the database: Connection refused' >&2; "
               "exit 1")
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr
    assert "sacctmgr list events failed" in out.stderr and "slurmdbd" in out.stderr


def test_since_sets_the_window_and_bad_times_are_refused_in_one_line(tmp_path) -> None:
    out = _cli(tmp_path, f"cat {FIXTURE}", "--since", "2026-12-02T14:00:00", "--json")
    assert out.returncode == 0, out.stderr
    argv = (tmp_path / "argv").read_text().split()
    assert "Start=2026-12-02T14:00:00" in argv
    for bad, words in (("2999-01-01T00:00:00", "--since 2999-01-01T00:00:00 is not in the past"),
                       ("yesterday", "'yesterday' is not a time like")):
        out = _cli(tmp_path, f"cat {FIXTURE}", "--since", bad)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
