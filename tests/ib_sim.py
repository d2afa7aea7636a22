"""A simulated InfiniBand fabric for tests: ibsim + opensm under libumad2sim.

Debian packages: ibsim-utils, libumad2sim0, infiniband-diags, opensm. ``ibsim -s NETFILE``
simulates the fabric described in ibnetdiscover format; every libibumad program run with
``LD_PRELOAD=libumad2sim.so`` talks to it instead of /dev/infiniband (the socket name comes
from IBSIM_SOCKNAME, so parallel simulators do not meet). ``opensm --once`` under the same
preload assigns LIDs, routes and brings ports to Active, which perfquery needs.

Observed behaviour of ibsim 0.10 (Debian 12) that the tests rely on:
- The console (stdin) takes ``Unlink "node"[port]`` and
  ``PerformanceSet "node"[port] PortCounters.<Field>=<value>``; it has no command to change a
  link's width or speed at run time. Enabled widths/speeds are set in the net file instead:
  ``width=N`` / ``speed=N`` lines (bitmasks: width 1=1X 2=4X 4=8X 8=12X, speed 1=SDR 2=DDR
  4=QDR) and per-port ``w=N`` / ``s=N`` options after a port line.
- A PortInfo Set from the SM makes *both* ends take the active width/speed from the enabled
  mask in the Set, so a degradation written on one end only is undone by opensm; it must be
  written on both ends of the cable.
- ibsim busy-loops once its stdin reaches EOF: always send ``Quit`` and kill by PID.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

PACKAGES = ("ibsim-utils", "libumad2sim0", "infiniband-diags", "opensm")
_COUNTER = itertools.count()


class SimError(RuntimeError):
    pass


def find_preload() -> str:
    """The libumad2sim.so path for this architecture."""
    candidates = sorted(Path("/usr/lib").glob("*/umad2sim/libumad2sim.so"))
    candidates += [Path(d, "umad2sim", "libumad2sim.so") for d in ("/usr/lib", "/usr/lib64")]
    for path in candidates:
        if path.exists():
            return str(path)
    return ""


def missing_requirements() -> list[str]:
    missing = [tool for tool in ("ibsim", "opensm", "iblinkinfo", "perfquery", "ibnetdiscover")
               if not (shutil.which(tool) or Path("/usr/sbin", tool).exists())]
    if not find_preload():
        missing.append("libumad2sim.so")
    return missing


def _which(tool: str) -> str:
    return shutil.which(tool) or str(Path("/usr/sbin", tool))


def degrade(net_text: str, node: str, port: int, peer: str, peer_port: int, opt: str) -> str:
    """Add a port option (``w=2``: 4X only, ``s=1``: SDR only) to both ends of one cable."""
    out = []
    current = ""
    for line in net_text.splitlines():
        header = re.match(r'^(?:Switch|Ca|Hca)\s+\d+\s+"([^"]+)"', line)
        if header:
            current = header.group(1)
        match = re.match(r'^\[(\d+)\]\s+"([^"]+)"\[(\d+)\]', line)
        if match:
            here, there, there_port = int(match.group(1)), match.group(2), int(match.group(3))
            if (current, here, there, there_port) in (
                (node, port, peer, peer_port),
                (peer, peer_port, node, port),
            ):
                line = f"{line} {opt}"
        out.append(line)
    return "\n".join(out) + "\n"


class SimFabric:
    """One ibsim process with its console, plus the environment for the diag tools."""

    def __init__(self, workdir: Path, net_text: str) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.netfile = workdir / "fabric.net"
        self.netfile.write_text(net_text)
        self.sockname = f"sfsim{os.getpid()}x{next(_COUNTER)}"
        self.preload = find_preload()
        self.proc: subprocess.Popen[str] | None = None
        self._output: list[str] = []
        self._lock = threading.Lock()
        self.pids: list[int] = []

    @property
    def env(self) -> dict[str, str]:
        """Environment for tools run against this fabric."""
        return {
            "LD_PRELOAD": self.preload,
            "IBSIM_SOCKNAME": self.sockname,
            "OSM_TMP_DIR": str(self.workdir),
            "OSM_CACHE_DIR": str(self.workdir),
        }

    def start(self, timeout: float = 10.0) -> None:
        env = {**os.environ, "IBSIM_SOCKNAME": self.sockname}
        self.proc = subprocess.Popen(
            [_which("ibsim"), "-s", str(self.netfile)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.workdir,
            env=env,
            start_new_session=True,
        )
        self.pids.append(self.proc.pid)
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        self.wait_for(r"sim> ", timeout)

    def _pump(self, pipe: IO[str]) -> None:
        while True:
            try:
                chunk = pipe.read(1)
            except (OSError, ValueError):  # the pipe was closed by stop()
                return
            if not chunk:
                return
            with self._lock:
                self._output.append(chunk)

    @property
    def output(self) -> str:
        with self._lock:
            return "".join(self._output)

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.output[start:]):
                return
            if self.proc and self.proc.poll() is not None:
                raise SimError(f"ibsim exited ({self.proc.returncode}):\n{self.output[-2000:]}")
            time.sleep(0.02)
        raise SimError(f"ibsim did not print {pattern!r} within {timeout}s:\n{self.output[-2000:]}")

    def command(self, line: str, expect: str = r"sim> ", timeout: float = 5.0) -> str:
        """Send one console command and wait for its answer (or the next prompt)."""
        assert self.proc and self.proc.stdin
        start = len(self.output)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        self.wait_for(expect, timeout, start)
        return self.output[start:]

    def run_tool(self, args: list[str], timeout: float = 30.0, **env: str) -> str:
        proc = subprocess.run(
            [_which(args[0]), *args[1:]],
            capture_output=True,
            text=True,
            cwd=self.workdir,
            env={**os.environ, **self.env, **env},
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise SimError(f"{args} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return proc.stdout

    def opensm_once(self, timeout: float = 30.0) -> None:
        """Run one opensm sweep (LIDs, routes, ports to Active) and let it exit."""
        self.run_tool(["opensm", "--once", "-f", str(self.workdir / "opensm.log")], timeout)

    def stop(self) -> None:
        """Quit the console, then kill by recorded PID whatever is left."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                assert proc.stdin
                proc.stdin.write("Quit\n")
                proc.stdin.flush()
                proc.wait(timeout=3)
            except (OSError, subprocess.TimeoutExpired, AssertionError):
                pass
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            print(f"ib_sim: ibsim pid {proc.pid} did not exit", file=sys.stderr)
        self.proc = None


def start(workdir: Path, net_text: str) -> SimFabric:
    """A running fabric with LIDs and routes (one opensm sweep); the test fails, never skips,
    when the simulator packages are missing (CI installs PACKAGES)."""
    import pytest

    missing = missing_requirements()
    if missing:
        pytest.fail(f"simulated-fabric tests need {', '.join(missing)}: "
                    f"apt-get install -y {' '.join(PACKAGES)}", pytrace=False)
    sim = SimFabric(workdir, net_text)
    try:
        sim.start()
        sim.opensm_once()
    except BaseException:
        sim.stop()
        raise
    return sim
