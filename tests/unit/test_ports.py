"""slurmfabric/rank/ports.py: the batch shell's MASTER_PORT is one no other live job holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slurmfabric.errors import RankEnvError
from slurmfabric.rank import ports
from slurmfabric.rank.ports import port_is_free

RANGE = (23400, 23409)


def _reserve_as(directory: Path, port: int, job: str, pid: int) -> None:
    start = ports._stat(pid)
    assert start is not None
    (directory / str(port)).write_text(f"{job} {pid} {start[2]}\n")


def test_a_port_held_by_a_live_job_moves_to_the_next(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _reserve_as(tmp_path, 23401, "111", holder.pid)
        # forced collision: job 222 starts from the same port job 111 holds
        port, notes = ports.choose(23401, RANGE, "222", lambda p: True, str(tmp_path))
        assert port == 23402
        assert "port 23401 is reserved by job 111" in notes
        assert "MASTER_PORT moved from 23401 to 23402" in notes
        assert (tmp_path / "23402").read_text().split()[0] == "222"
        # the same job asking again (env run twice) gets its own port back
        assert ports.choose(23402, RANGE, "222", lambda p: True, str(tmp_path))[0] == 23402
    finally:
        holder.kill()
        holder.wait()
    # once the holder is gone its reservation is stale and the port is reused
    assert ports.choose(23401, RANGE, "333", lambda p: True, str(tmp_path))[0] == 23401


def test_a_reused_pid_does_not_keep_a_dead_jobs_port(tmp_path: Path) -> None:
    me = ports._stat(os.getpid())
    assert me is not None
    (tmp_path / "23405").write_text(f"111 {os.getpid()} {int(me[2]) + 1}\n")  # other start
    assert ports.choose(23405, RANGE, "222", lambda p: True, str(tmp_path))[0] == 23405


def test_a_bound_port_is_skipped_and_wraps_at_the_top(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("", 23409))
        sock.listen()
        port, notes = ports.choose(23409, RANGE, "9", port_is_free, str(tmp_path))
    assert port == 23400 and "port 23409 is in use on this node" in notes
    assert not (tmp_path / "23409").exists()  # a port we could not use is not kept


def test_every_port_taken_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RankEnvError, match=r"no free MASTER_PORT in 23400-23401"):
        ports.choose(23400, (23400, 23401), "1", lambda p: False, str(tmp_path))


def test_without_a_directory_only_the_bind_check_runs(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    port, notes = ports.choose(23403, RANGE, "1", lambda p: p != 23403, str(blocked / "x"))
    assert port == 23404 and notes[0].startswith("no port reservation directory")


def test_owner_is_the_jobs_slurmstepd_or_our_parent() -> None:
    pid, start = ports.owner()
    assert pid == os.getppid() and start == ports._stat(os.getppid())[2]
