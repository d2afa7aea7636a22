"""slurmfabric._common.probe: one command, its own process group, a deadline, a group kill."""

from __future__ import annotations

import os
import sys
import time

import pytest

from slurmfabric._common import probe as _probe


def test_returns_output_code_and_time():
    done = _probe.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], 10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "")
    assert 0 < done.seconds < 10


def test_missing_program_raises_oserror():
    with pytest.raises(FileNotFoundError):
        _probe.run(["/nonexistent/slurmfabric-probe"], 1)


def test_deadline_kills_the_whole_group(tmp_path):
    """A grandchild holding the pipes open must die too, and the call must return on time."""
    pidfile = tmp_path / "grandchild"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    with pytest.raises(_probe.Deadline) as caught:
        _probe.run([sys.executable, "-c", script], 1.0)
    assert time.monotonic() - start < 5
    assert caught.value.timeout == 1.0 and caught.value.state is None
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # reaped by init shortly after SIGKILL
        if _probe.process_state(grandchild) in (None, "Z"):
            break
        time.sleep(0.05)
    assert _probe.process_state(grandchild) in (None, "Z")


def test_process_state_reads_proc():
    assert _probe.process_state(os.getpid()) in ("R", "S")
    assert _probe.process_state(2**22 + 12345) is None
