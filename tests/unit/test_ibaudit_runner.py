"""The tool runner: deadlines kill the whole process group, errors quote the tool."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from slurmfabric.errors import TopologyError
from slurmfabric.ibaudit import runner

FIX = Path(__file__).parent.parent / "fixtures" / "ib"


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_deadline_kills_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    slow = script(tmp_path, "iblinkinfo", f"sleep 30 & echo $! > {pidfile}; wait\n")
    tools = runner.Tools(paths={"iblinkinfo": slow}, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(TopologyError, match="no answer within 0.5s"):
        runner.iblinkinfo(tools)
    assert time.monotonic() - start < 5
    child = int(pidfile.read_text())
    assert _gone(child)


def _gone(pid: int) -> bool:
    """Killed: no such process, or a zombie waiting for init to reap it."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_failure_quotes_stderr_and_missing_tool_hints(tmp_path: Path) -> None:
    bad = script(tmp_path, "ibstat", "echo 'ibpanic: stat of IB device failed' >&2; exit 1\n")
    with pytest.raises(TopologyError, match="exit 1.*ibpanic: stat of IB device failed"):
        runner.ibstat(runner.Tools(paths={"ibstat": bad}))
    with pytest.raises(TopologyError) as info:
        runner.ibstat(runner.Tools(paths={"ibstat": str(tmp_path / "nope")}))
    assert "--ibstat PATH" in (info.value.hint or "")


def test_from_env_and_extra_args(tmp_path: Path) -> None:
    echo = script(tmp_path, "pq", 'echo "$@"\n')
    tools = runner.Tools.from_env(
        {"SLURMFABRIC_PERFQUERY": echo, "SLURMFABRIC_IBDIAG_ARGS": "-C mlx5_0 -P 1"}
    )
    assert runner.perfquery(tools, 9, 1, extended=True).split() == [
        "-C", "mlx5_0", "-P", "1", "-x", "9", "1"
    ]


def test_counters_fall_back_to_plain_perfquery(tmp_path: Path) -> None:
    plain = FIX / "sim_sfn05_perfquery.txt"
    ext = FIX / "sim_sfn05_perfquery_x.txt"
    fake = script(
        tmp_path, "perfquery",
        f'if [ "$1" = -x ]; then cat {ext}; elif [ "$1" = 7 ]; then exit 3; else cat {plain}; fi\n',
    )
    tools = runner.Tools(paths={"perfquery": fake}, jobs=2)
    results = runner.collect_counters(tools, [(9, 1), (7, 1)])
    assert "SymbolErrorCounter:..............42" in results[(9, 1)]  # type: ignore[operator]
    assert "PortXmitData" in results[(9, 1)]  # type: ignore[operator]
    # lid 7: -x answered without error counters and the plain query failed; that port
    # yields its error and the others still return their counters.
    assert isinstance(results[(7, 1)], TopologyError)
    assert "perfquery 7 1 failed (exit 3)" in str(results[(7, 1)])
