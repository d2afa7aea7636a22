"""One pair's per-rail RDMA test: a perftest server on the pair's first node, a client on
the second, one of each per rail at once, each pinned to its HCA's NUMA node.

Run as the two tasks of a pair's job step (``pairs submit --test ib_write_bw``): task 0
starts one server per rail (``ib_write_bw -d RAIL -p PORT+i``) and waits for them; task 1
starts the clients against the first node of the step (SLURM_STEP_NODELIST) and prints each
rail's output under a ``== rail RAIL ==`` line, rail after rail, so the pair's output file
reads in order. A client that cannot connect yet (its server still starting) is retried.
With ``cuda`` rail i uses GPU i (``--use_cuda=i``): list the rails in GPU order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from slurmfabric.slurm.hostlist import expand

BASE_PORT = 18515  # perftest's default port; rail i listens on BASE_PORT + i
RAIL_MARK = "== rail "
CONNECT_RETRIES = 20


def numa_node(rail: str, root: str = "/") -> int | None:
    """The HCA's NUMA node from sysfs (-1 or unreadable: not known)."""
    device = rail.split(":")[0]
    try:
        with open(os.path.join(root, "sys/class/infiniband", device, "device/numa_node")) as f:
            value = int(f.read(16).strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _argv(tool: list[str], rail: str, index: int, cuda: bool, root: str) -> list[str]:
    device, _, port = rail.partition(":")
    argv = [*tool, "-d", device, "-p", str(BASE_PORT + index)]
    if port:
        argv += ["-i", port]
    if cuda:
        argv.append(f"--use_cuda={index}")
    node = numa_node(rail, root)
    if node is not None and shutil.which("numactl"):
        argv = ["numactl", f"--cpunodebind={node}", f"--membind={node}", *argv]
    return argv


def run(rails: list[str], tool: list[str], cuda: bool = False, timeout: float = 600.0,
        env: dict[str, str] | None = None) -> int:
    """This task's half of the test; returns its exit status (non-zero if a rail failed)."""
    env = dict(os.environ if env is None else env)
    rank = int(env.get("SLURM_PROCID", "0"))
    root = env.get("SLURMFABRIC_SYSFS_ROOT", "/")
    nodes = expand(env.get("SLURM_STEP_NODELIST", ""))
    if len(nodes) != 2:
        print(f"rdma-step: the step has {len(nodes)} nodes, expected 2 "
              f"(SLURM_STEP_NODELIST={env.get('SLURM_STEP_NODELIST', '')!r})")
        return 2
    if rank == 0:
        servers = [subprocess.Popen(_argv(tool, rail, i, cuda, root), env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True) for i, rail in enumerate(rails)]
        status = 0
        for rail, proc in zip(rails, servers):
            try:
                _, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                err, proc.returncode = "timed out", 124
            if proc.returncode:
                status = 1
                print(f"rdma-step server {rail}: exit {proc.returncode}: "
                      f"{' '.join((err or '').split())[-200:]}", flush=True)
        return status
    outputs = {}
    procs = {}
    for i, rail in enumerate(rails):
        procs[rail] = _client(_argv(tool, rail, i, cuda, root) + [nodes[0]], env)
    status = 0
    for rail in rails:
        code, text = _finish(procs[rail], timeout)
        outputs[rail] = text
        status = status or (1 if code else 0)
    for rail in rails:
        print(f"{RAIL_MARK}{rail} ==")
        print(outputs[rail].rstrip("\n"))
    return status


def _client(argv: list[str], env: dict[str, str]) -> list:
    return [argv, env, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True), 0]


def _finish(state: list, timeout: float) -> tuple[int, str]:
    """Wait for a client; start it again while it only failed to reach its server."""
    argv, env, proc, tries = state
    while True:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return 124, "rdma-step: client timed out\n"
        if proc.returncode and "Couldn't connect to" in out and tries < CONNECT_RETRIES:
            tries += 1
            time.sleep(0.25)
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            continue
        return proc.returncode, out


def split_rails(text: str) -> dict[str, str]:
    """A pair's output file -> rail -> that rail's client output."""
    rails: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(RAIL_MARK) and line.endswith(" =="):
            current = line[len(RAIL_MARK):-3].strip()
            rails[current] = []
        elif current is not None:
            rails[current].append(line)
    return {rail: "\n".join(lines) + "\n" for rail, lines in rails.items()}


def step_command(exe: str, test: str, rails_text: str, cuda: bool,
                 extra: list[str]) -> list[str]:
    """The step of a per-rail perftest pair: ``slurmfabric pairs rdma-step`` on both tasks,
    the tool reporting in Gb/s (``--report_gbits``: what the report reads). Rail names are
    checked here, before they reach a job script."""
    import re

    from slurmfabric.errors import UsageError

    rails = [r for r in rails_text.split(",") if r]
    for rail in rails:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}(?::[0-9]{1,3})?", rail):
            raise UsageError(f"--rails: {rail!r} is not an HCA name like mlx5_0 or mlx5_0:1")
    argv = [exe, "pairs", "rdma-step", "--rails", ",".join(rails)]
    if cuda:
        argv.append("--cuda")
    return [*argv, "--", test, "--report_gbits", *extra]
