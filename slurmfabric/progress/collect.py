"""The per-node collector of ``slurmfabric jobs diagnose``: every rank's Python stack.

``python -m slurmfabric.progress.collect JOB [--progress-dir D] [--flight-prefix P]``
runs once on each node of the job (one ``srun --overlap`` step, built by
``slurmfabric.progress.diagnose``) and prints JSON records: one per rank process found
(``{"kind": "rank", ...}``), then one for the node (``{"kind": "node", ...}``: host,
py-spy, heartbeats and flight recorder dumps found on this node). Each record travels
framed in short numbered lines (``slurmfabric.progress.frames``): srun cuts longer lines.

Which processes are the job's ranks: those whose initial environment
(``/proc/PID/environ``) has ``SLURM_JOB_ID=JOB`` and a rank number (``RANK``, set by
torchrun and ``slurmfabric launch``; else ``SLURM_PROCID``), and whose executable is a
Python. The environment, not the job's cgroup, because it works the same with every
proctrack plugin, cgroup v1 and v2, and inside containers (where the cgroup path is
namespaced), and it is what the job's own owner may read (same uid; root reads all).
``/proc/PID/environ`` is the environment the process started with, so a program that
changes ``os.environ`` does not hide. This step's own processes (same SLURM_STEP_ID) and
the torchrun agent (no ``RANK`` when its workers have one) are left out, and so are a
rank's own child processes (DataLoader workers inherit ``RANK``): a rank is the topmost
process of its Slurm step with that rank number (``_topmost``).

Each rank's state is field 3 of ``/proc/PID/stat`` (proc(5)): ``T`` stopped, ``D``
uninterruptible sleep, ``Z`` zombie; a process gone between listing and reading is
``gone``. Its stack is ``py-spy dump --pid P --json`` (https://github.com/benfred/py-spy;
the optional extra ``slurmfabric[diagnose]``), with ``--nonblocking`` for a stopped process
(py-spy cannot pause a process that is already stopped). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys

from slurmfabric.progress import flight, frames

PYSPY_TIMEOUT = 10.0
STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible (D)", "T": "stopped",
          "t": "stopped (traced)", "Z": "zombie", "X": "dead", "I": "idle"}


def read_environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read(1024 * 1024)
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def proc_state(pid: int) -> str:
    """The one-letter state of proc(5), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return "gone"
    # field 2 (comm) is in parentheses and may itself contain ") ": split after the last
    rest = text[text.rfind(")") + 2:].split()
    return rest[0] if rest else "gone"


def _is_python(pid: int) -> bool:
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe.startswith(("python", "pypy"))


def parent(pid: int) -> int:
    """Field 4 of ``/proc/PID/stat`` (proc(5)); 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
        return int(text[text.rfind(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _ancestors(pid: int) -> list[int]:
    """``pid`` and its parents up to (not including) init."""
    chain: list[int] = []
    while pid > 1 and pid not in chain:
        chain.append(pid)
        pid = parent(pid)
    return chain


def _own_tree() -> set[int]:
    return set(_ancestors(os.getpid()))


def find_ranks(job: str) -> list[dict[str, object]]:
    """The job's rank processes on this node: pid, rank, local rank, environment facts."""
    own = _own_tree()
    own_step = os.environ.get("SLURM_STEP_ID") if os.environ.get("SLURM_JOB_ID") == job \
        else None
    # Several slurmd on one host (multiple-slurmd, a test cluster) see each other's
    # processes: a rank started by another node's slurmd is that node's to report.
    node = os.environ.get("SLURMD_NODENAME")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in own:
            continue
        pid = int(entry)
        env = read_environ(pid)
        if not env or env.get("SLURM_JOB_ID") != job:
            continue
        if own_step is not None and env.get("SLURM_STEP_ID") == own_step:
            continue
        if node and env.get("SLURMD_NODENAME", node) != node:
            continue
        if not _is_python(pid):
            continue
        found.append({"pid": pid, "env_rank": env.get("RANK"),
                      "procid": env.get("SLURM_PROCID"),
                      "local": env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or "",
                      "world": env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or "",
                      "progress_dir": env.get("SLURMFABRIC_PROGRESS_DIR", ""),
                      "step": env.get("SLURM_STEP_ID", ""),
                      "flight_prefixes": flight.prefixes_from_env(env)})
    with_rank = [p for p in found if (p["env_rank"] or "").isdigit()]
    chosen = with_rank or [p for p in found if (p["procid"] or "").isdigit()]
    for p in chosen:
        p["rank"] = int(str(p["env_rank"] if with_rank else p["procid"]))
    return sorted(_topmost(chosen), key=lambda p: (p["rank"], p["pid"]))


def _topmost(procs: list[dict[str, object]]) -> list[dict[str, object]]:
    """The rank processes, without their children: a process whose ancestor is a process
    of the same Slurm step with the same rank is that rank's child (a DataLoader worker,
    fork or spawn, a forkserver, a checkpoint writer: they inherit RANK) and is listed
    in its rank's ``children``. The ancestry, not the process group or session: srun
    and torchrun put a rank and its children in one process group, and a rank that calls
    setsid(2) leaves it, while parenthood holds either way."""
    key = {int(str(p["pid"])): (p["step"], p["rank"]) for p in procs}
    tops: dict[int, dict[str, object]] = {}
    children: dict[int, list[int]] = {}
    for p in procs:
        pid = int(str(p["pid"]))
        top = next((a for a in reversed(_ancestors(pid)[1:]) if key.get(a) == key[pid]),
                   None)
        if top is None:
            tops[pid] = p
        else:
            children.setdefault(top, []).append(pid)
    for pid, p in tops.items():
        p["children"] = sorted(children.get(pid, []))
    return list(tops.values())


def pyspy_path() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def dump_stack(pyspy: str, pid: int, state: str) -> tuple[list[dict[str, object]], str]:
    """(threads, error): each thread's name and frames, innermost first. With native
    frames (``--native``: where a rank waits inside C++, e.g. ``c10d::Work::wait`` under
    an async collective's ``wait()``) where py-spy can; a stopped process gets
    ``--nonblocking``, which py-spy cannot combine with ``--native``; a native dump that
    fails is taken again without."""
    argv = [pyspy, "dump", "--pid", str(pid), "--json"]
    if state in ("T", "t"):
        return _dump(argv + ["--nonblocking"], pid)
    threads, error = _dump(argv + ["--native"], pid)
    return (threads, error) if threads else _dump(argv, pid)


def _dump(argv: list[str], pid: int) -> tuple[list[dict[str, object]], str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PYSPY_TIMEOUT,
                              check=False)
    except subprocess.TimeoutExpired:
        return [], f"py-spy dump timed out after {PYSPY_TIMEOUT:.0f} s"
    except OSError as error:
        return [], f"py-spy: {error}"
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no output"])
        return [], "py-spy: " + " / ".join(line.strip() for line in first[:3])
    try:
        raw = json.loads(done.stdout)
    except ValueError:
        return [], "py-spy printed no JSON"
    return threads_from_pyspy(raw, pid), ""


def threads_from_pyspy(raw: object, pid: int) -> list[dict[str, object]]:
    """py-spy's ``dump --json`` as the record's threads, the main thread first."""
    threads = []
    for thread in raw if isinstance(raw, list) else []:
        frames = [{"name": str(f.get("name", "?")), "file": str(f.get("filename", "?")),
                   "line": f.get("line")} for f in thread.get("frames") or []]
        threads.append({"name": str(thread.get("thread_name") or thread.get("thread_id")),
                        "native_id": thread.get("os_thread_id"), "frames": frames})
    # the main thread first: its os thread id is the pid
    threads.sort(key=lambda t: t["native_id"] != pid)
    return threads


def read_beats(directory: str) -> dict[str, object]:
    from slurmfabric.progress.watch import read_beats as read

    return {str(rank): vars(beat) for rank, beat in read(directory).items()}


def collect(job: str, progress_dir: str | None = None,
            flight_prefix: str | None = None) -> tuple[list[dict[str, object]], dict[str, object]]:
    """(ranks, node): everything this node can tell about the job's ranks."""
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    pyspy = pyspy_path()
    procs = find_ranks(job)

    def one(proc: dict[str, object]) -> dict[str, object]:
        pid = int(str(proc["pid"]))
        state = proc_state(pid)
        threads, error = ([], "py-spy is not installed: pip install 'slurmfabric[diagnose]'"
                          ) if pyspy is None else dump_stack(pyspy, pid, state)
        after = proc_state(pid)
        return {"kind": "rank", "host": host, "pid": pid, "rank": proc["rank"],
                "local": proc["local"], "world": proc["world"], "children": proc["children"],
                "state": "gone" if after == "gone" else state,
                "threads": threads, "error": error}

    # every rank's dump at once: a native dump takes 1-3 s (symbols), 8 in a row would
    # take the whole hang budget
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(procs), 16))) as pool:
        ranks = list(pool.map(one, procs))
    # where the ranks were told to write, unless the caller says
    dirs = {progress_dir} if progress_dir else {str(p["progress_dir"]) for p in procs
                                                if p["progress_dir"]}
    prefixes = {flight_prefix} if flight_prefix else {
        str(prefix) for p in procs for prefix in p["flight_prefixes"]}
    beats: dict[str, object] = {}
    for directory in sorted(dirs):
        beats.update(read_beats(directory))
    dumps: dict[str, object] = {}
    for prefix in sorted(prefixes):
        dumps.update({str(k): v for k, v in flight.collect(prefix).items()})
    node = {"kind": "node", "host": host, "job": job, "pyspy": pyspy,
            "error": "" if pyspy else "py-spy is not installed on this node: "
                     "pip install 'slurmfabric[diagnose]' (or py-spy) in the job's Python",
            "beats": beats, "flight": dumps}
    return ranks, node


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slurmfabric.progress.collect")
    p.add_argument("job")
    p.add_argument("--progress-dir")
    p.add_argument("--flight-prefix")
    args = p.parse_args(argv)
    ranks, node = collect(args.job, args.progress_dir, args.flight_prefix)
    for record in [*ranks, node]:  # srun cuts lines over 1 KiB: frames.py
        for line in frames.frame(json.dumps(record, sort_keys=True)):
            sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
