"""Bad input to every command that reads a file, a directory, an expression or a number.

Each (command, input) runs as a real subprocess under an address-space limit and a
deadline; it must end with exit code 1 or 2 (2 for input that is not what the command
reads), print at most a one-line error (plus an optional HINT line) and never a
traceback or slurmfabric's "internal error" (exit 70).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.hostile

MEMORY_LIMIT = 1 << 30  # address space: a reader that slurps /dev/zero dies here
DEADLINE = 30

# name -> bytes (None: made specially below)
CONTENTS: dict[str, bytes | None] = {
    "empty": b"",
    "binary": bytes(range(256)) * 64,
    "nul": b"\x00" * 4096,
    "not-utf8": b"caf\xe9 \xff\xfe\n" * 10,
    "truncated-json": b'{"links": [{"a": ',
    "json-list": b"[]",
    "json-string": b'"links"',
    "json-wrong-types": json.dumps({"links": 5, "nodes": "x", "rounds": 7,
                                    "slurmfabric_topology": 1, "topology": []}).encode(),
    "json-deep": b"[" * 200000 + b"]" * 200000,
    "json-huge-int": b'{"links": [' + b"9" * 5000 + b"]}",
    "huge-line": b"NCCL INFO " + b"x" * (20 << 20) + b"\n",
    "big-sparse": None,  # 100 MB of zeros (a sparse file)
    "directory": None,
    "fifo": None,
    "dangling": None,
    "dev-zero": None,
}


def make(tmp: Path, name: str) -> Path:
    path = tmp / f"in-{name}"
    content = CONTENTS[name]
    if content is not None:
        path.write_bytes(content)
    elif name == "big-sparse":
        with open(path, "wb") as handle:
            handle.truncate(100 << 20)
    elif name == "directory":
        path.mkdir()
    elif name == "fifo":
        os.mkfifo(path)
    elif name == "dangling":
        path.symlink_to(tmp / "nowhere")
    elif name == "dev-zero":
        return Path("/dev/zero")
    return path


# command template -> {IN} is the bad input; each runs for every input kind
COMMANDS = [
    ["nccl-log", "{IN}"],
    ["nccl-tests", "parse", "{IN}"],
    ["nccl-tests", "parse", "{IN}", "--ports", "8"],
    ["ib", "links", "--input", "{IN}"],
    ["ib", "audit", "--input", "{IN}"],
    ["ib", "audit", "--input", "{GOOD_LINKS}", "--baseline", "{IN}"],
    ["ib", "audit", "--input", "{GOOD_LINKS}", "--node-map", "{IN}"],
    ["topo", "--from", "{IN}"],
    ["topo", "--sysfs-root", "{IN}"],
    ["pairs", "report", "{DIR_WITH_PLAN}"],
    ["render", "--from-script", "{IN}"],
    ["render", "-c", "{IN}"],
    ["submit", "--dry-run", "-c", "{IN}"],
    ["health", "check", "--config", "{IN}"],
    ["roce", "report", "{DIR_WITH_SAMPLE}"],
    ["roce", "audit", "--switch", "{IN}", "--priority", "3", "--dscp", "26"],
    ["roce", "audit", "--switch", "sonic:{IN}", "--priority", "3", "--dscp", "26"],
    ["site", "cli-filter", "--config", "{IN}"],
    ["site", "install", "{TMP}/hooks", "--config", "{IN}"],
]
# option values and expressions that are not what the command accepts
ARGUMENTS = [
    ["nccl-tests", "parse", "{LOG}", "--rates", "nan,400"],
    ["nccl-tests", "parse", "{LOG}", "--rates", "-400"],
    ["nccl-tests", "parse", "{LOG}", "--ports", "0"],
    ["nccl-tests", "parse", "{LOG}", "--ports", "8", "--port-rate", "inf"],
    ["nccl-tests", "parse", "{LOG}", "--expect-busbw", "-5"],
    ["ib", "audit", "--input", "{GOOD_LINKS}", "--expect-rate", "nan"],
    ["ib", "links", "--input", "{GOOD_LINKS}", "--ibdiag-args", "-C 'mlx5_0"],
    ["ib", "links", "--iblinkinfo", "{NOT_EXEC}"],
    ["pairs", "submit", "--nodes", "n[1-4]", "--results", "{TMP}/r", "--command", 'x "y',
     "--dry-run"],
    ["pairs", "report", "{TMP}/no-such-dir"],
    ["pairs", "report", "{FILE_NOT_DIR}"],
    ["hostlist", "index", "a[1-65536]b[1-65536]", "a5b5"],
    ["hostlist", "compress", "a[1-65536]b[1-65536]"],
    ["hostlist", "expand", "n[1-99999999999999999999]"],
    ["hostlist", "count", "n[" + "9" * 5000 + "]"],
    ["render", "--set", "job.nodes=" + "9" * 5000],
    ["render", "-o", "{TMP}", "--set", "launcher.type=srun", "--set", "job.ntasks_per_node=1",
     "--set", 'program.command=["x"]'],
    ["render", "-o", "{TMP}/missing/dir/x.sh", "--set", "launcher.type=srun",
     "--set", "job.ntasks_per_node=1", "--set", 'program.command=["x"]'],
    ["topo", "snapshot", "-o", "{TMP}/missing/dir/x.tar.gz"],
    ["topo", "--ntasks", "-3"],
    ["env", "--port-range", "99999-1"],
    ["launch", "--mode", "bogus", "--", "true"],
    ["pairs", "submit", "--nodes", "n[1-4]", "--results", "{TMP}/r", "--pattern", "k-batch",
     "--batch", "9", "--dry-run"],
    ["pairs", "submit", "--nodes", "n[1-4]", "--results", "{TMP}/r", "--pattern", "k-batch",
     "--dry-run"],
    ["roce", "audit", "--nodes", "n[1-4]", "--results", "relative/dir", "--dry-run"],
    ["roce", "audit", "--nodes", "n[1-4]", "--results", "{TMP}/r", "--interval", "nan",
     "--dry-run"],
    ["roce", "report", "{TMP}/no-such-dir"],
    ["roce", "report", "{TMP}"],
    ["site", "install", "{TMP}/hooks2", "--python", "python3"],
]
GOOD_LINKS = (Path(__file__).resolve().parents[1] / "fixtures" / "ib")


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    env.update(SLURMFABRIC_SITE_DEFAULTS="", SLURM_JOB_ID="7", SLURM_JOB_NODELIST="n1",
               SLURM_JOB_NUM_NODES="1")
    return subprocess.run([sys.executable, "-m", "slurmfabric", *argv], cwd=cwd, env=env,
                          capture_output=True, timeout=DEADLINE, preexec_fn=_limits,
                          stdin=subprocess.DEVNULL)


# (command, input) pairs where the input is legitimately fine: an empty node map or an
# empty health config (all defaults) are valid files.
VALID = {("--node-map", "empty"), ("check", "empty")}


def _check(argv: list[str], proc: subprocess.CompletedProcess,
           kind: str | None = None) -> str | None:
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode == 0 and any(flag in argv and kind == name for flag, name in VALID):
        return None
    lines = [line for line in err.splitlines() if line.strip()]
    if "Traceback" in err or proc.returncode == 70 or "internal error" in err:
        return f"{argv}: traceback/internal error (rc {proc.returncode}): {err[-600:]}"
    if proc.returncode not in (1, 2):
        return f"{argv}: exit {proc.returncode} (want 1 or 2): {err[-300:]}"
    errors = [line for line in lines if "error" in line.lower()]
    if proc.returncode == 2 and not errors:
        return f"{argv}: exit 2 without an error line: {err[-300:]}"
    if len([line for line in lines if not line.startswith(("HINT:", "usage:", " "))]) > 3:
        return f"{argv}: more than a short error: {err[-600:]}"
    return None


def _good_links() -> str:
    candidates = sorted(GOOD_LINKS.glob("*iblinkinfo*.txt"))
    assert candidates, f"no recorded iblinkinfo under {GOOD_LINKS}"
    return str(candidates[0])


def test_every_command_refuses_bad_input_cleanly(tmp_path: Path, hostile_report) -> None:
    inputs = {name: make(tmp_path, name) for name in CONTENTS}
    plan_dirs, sample_dirs = {}, {}
    for name, path in inputs.items():
        if name in ("directory", "fifo", "dangling", "dev-zero", "big-sparse"):
            continue
        directory = tmp_path / f"results-{name}"
        directory.mkdir()
        (directory / "plan.json").write_bytes(path.read_bytes())
        plan_dirs[name] = directory
        samples = tmp_path / f"samples-{name}"
        samples.mkdir()
        (samples / "n1.0.json").write_bytes(path.read_bytes())
        sample_dirs[name] = samples
    not_exec = tmp_path / "not-exec"
    not_exec.write_text("#!/bin/sh\n")
    log = tmp_path / "ok.log"
    log.write_text("# nothing\n")
    file_not_dir = tmp_path / "a-file"
    file_not_dir.write_text("x")
    subs = {"{GOOD_LINKS}": _good_links(), "{TMP}": str(tmp_path), "{NOT_EXEC}": str(not_exec),
            "{LOG}": str(log), "{FILE_NOT_DIR}": str(file_not_dir)}
    runs: list[list[str]] = []
    for template in COMMANDS:
        for name, path in inputs.items():
            if "{DIR_WITH_PLAN}" in template:
                if name not in plan_dirs:
                    continue
                subs_here = {**subs, "{DIR_WITH_PLAN}": str(plan_dirs[name])}
            elif "{DIR_WITH_SAMPLE}" in template:
                if name not in sample_dirs:
                    continue
                subs_here = {**subs, "{DIR_WITH_SAMPLE}": str(sample_dirs[name])}
            else:
                subs_here = {**subs, "{IN}": str(path)}
            runs.append(([_fill(arg, subs_here) for arg in template], name))
    runs += [([_fill(arg, subs) for arg in template], None) for template in ARGUMENTS]
    failures = []
    for argv, kind in runs:
        try:
            proc = _run(argv, tmp_path)
        except subprocess.TimeoutExpired:
            failures.append(f"{argv}: no answer within {DEADLINE} s")
            continue
        problem = _check(argv, proc, kind)
        if problem:
            failures.append(problem)
    hostile_report(f"bad inputs: {len(runs)} command runs, {len(failures)} problems "
                   f"(address space {MEMORY_LIMIT >> 20} MiB, deadline {DEADLINE} s each)")
    assert not failures, "\n".join(failures[:25]) + f"\n... {len(failures)} problems"


def _fill(arg: str, subs: dict[str, str]) -> str:
    for key, value in subs.items():
        arg = arg.replace(key, value)
    return arg


def _clean_refusal(argv: list[str], proc: subprocess.CompletedProcess, names: str) -> str | None:
    """Exit 2, one error line naming ``names`` (a file), at most a HINT line more."""
    err = proc.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    if "Traceback" in err or proc.returncode == 70 or "internal error" in err:
        return f"{argv}: traceback/internal error (rc {proc.returncode}): {err[-600:]}"
    if proc.returncode != 2:
        return f"{argv}: exit {proc.returncode} (want 2): {err[-300:]}"
    if len(lines) > 2 or (len(lines) == 2 and not lines[1].startswith("HINT:")):
        return f"{argv}: more than one error line (and a HINT): {err[-600:]}"
    if not lines or "error" not in lines[0] or names not in lines[0]:
        return f"{argv}: the error does not name {names!r}: {err[-300:]}"
    return None


def _tarball(path: Path, members: list[tuple[str, str, bytes | str]], mode: str = "w:gz") -> None:
    """A tarball with a sys/ tree plus ``members``: (name, kind, data or link target)."""
    import io
    import tarfile

    kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
             "hardlink": tarfile.LNKTYPE, "chardev": tarfile.CHRTYPE,
             "blockdev": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE}
    with tarfile.open(path, mode) as tar:
        top = tarfile.TarInfo("sys")
        top.type, top.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(top)
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kinds[kind]
            if kind == "file":
                assert isinstance(data, bytes)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            if kind in ("symlink", "hardlink"):
                info.linkname = str(data)
            if kind in ("chardev", "blockdev"):
                info.devmajor, info.devminor = 1, 5  # /dev/zero
            tar.addfile(info)


# name -> members of a hostile snapshot tarball (each beside an ordinary sys/ tree)
TARBALLS: dict[str, list[tuple[str, str, bytes | str]]] = {
    "traversal": [("../escaped", "file", b"x")],
    "traversal-inside": [("sys/../../escaped", "file", b"x")],
    "absolute": [("/tmp/slurmfabric-hostile-absolute", "file", b"x")],
    "symlink-absolute": [("sys/zero", "symlink", "/dev/zero")],
    "symlink-up": [("sys/passwd", "symlink", "../../../../etc/passwd")],
    "symlink-then-write": [("sys/up", "symlink", "../.."), ("sys/up/escaped", "file", b"x")],
    "hardlink-absolute": [("sys/h", "hardlink", "/etc/passwd")],
    "hardlink-up": [("sys/h", "hardlink", "../etc/passwd")],
    "device-char": [("sys/zero", "chardev", "")],
    "device-block": [("sys/disk", "blockdev", "")],
    "fifo": [("sys/fifo", "fifo", "")],
    "claims-10-GB": [],  # a header that claims a huge member, made below
}


def test_hostile_snapshot_tarballs_are_refused_cleanly(tmp_path: Path, hostile_report) -> None:
    """topo --from on a tarball Python's tar filter would refuse (or that is cut short) must
    say which file and member, exit 2, and leave nothing outside its scratch directory."""
    import gzip
    import tarfile

    work = tmp_path / "work"
    work.mkdir()
    paths: dict[str, Path] = {}
    for name, members in TARBALLS.items():
        paths[name] = work / f"{name}.tar.gz"
        _tarball(paths[name], members)
    huge = tarfile.TarInfo("sys/huge")
    huge.size = 10 << 30
    header = huge.tobuf(format=tarfile.GNU_FORMAT)
    paths["claims-10-GB"].write_bytes(gzip.compress(header + b"\0" * 4096))
    good = work / "good.tar.gz"
    _tarball(good, [(f"sys/f{i}", "file", os.urandom(512)) for i in range(64)])
    data = good.read_bytes()
    for name, cut in (("truncated-gzip", data[: len(data) // 2]), ("truncated-header", data[:20]),
                      ("gzip-magic-then-garbage", b"\x1f\x8b" + os.urandom(4000)),
                      ("not-gzip", os.urandom(4000))):
        paths[name] = work / f"{name}.tar.gz"
        paths[name].write_bytes(cut)
    failures = []
    for name, path in paths.items():
        argv = ["topo", "--from", str(path)]
        try:
            proc = _run(argv, work)
        except subprocess.TimeoutExpired:
            failures.append(f"{name}: no answer within {DEADLINE} s")
            continue
        if name == "not-gzip":  # neither a tarball nor JSON: exit 1 or 2, still one line
            problem = _check(argv, proc)
        else:
            problem = _clean_refusal(argv, proc, str(path))
        if problem:
            failures.append(f"{name}: {problem}")
    escaped = [p for p in (tmp_path / "escaped", work.parent.parent / "escaped",
                           Path("/tmp/slurmfabric-hostile-absolute")) if p.exists()]
    hostile_report(f"hostile snapshot tarballs: {len(paths)} runs, {len(failures)} problems")
    assert not escaped, f"a member was written outside the scratch directory: {escaped}"
    assert not failures, "\n".join(failures)


# plan.json contents that 'pairs submit' never writes
PLANS: dict[str, object] = {
    "no-nodes-key": {"rounds": []},
    "no-nodes": {"nodes": [], "rounds": []},
    "one-node": {"nodes": ["a"], "rounds": []},
    "nodes-not-a-list": {"nodes": "a,b", "rounds": []},
    "unknown-node": {"nodes": ["a", "b"], "rounds": [[["a", "c"]]]},
    "non-string-nodes": {"nodes": [1, 2], "rounds": [[[1, 2]]]},
    "null-node": {"nodes": ["a", None], "rounds": [[["a", None]]]},
    "non-string-in-pair": {"nodes": ["a", "b"], "rounds": [[["a", 7]]]},
    "path-as-node": {"nodes": ["../../x", "b"], "rounds": [[["../../x", "b"]]]},
    "duplicate-node": {"nodes": ["a", "a", "b"], "rounds": [[["a", "b"]]]},
    "same-node-twice": {"nodes": ["a", "b"], "rounds": [[["a", "a"]]]},
    "pair-as-string": {"nodes": ["a", "b"], "rounds": [["ab"]]},
    "pair-of-three": {"nodes": ["a", "b", "c"], "rounds": [[["a", "b", "c"]]]},
    "rounds-not-lists": {"nodes": ["a", "b"], "rounds": [5]},
    "batch-unknown": {"nodes": ["a", "b"], "rounds": [[["a", "z"]]], "pattern": "k-batch"},
    "bad-pattern": {"nodes": ["a", "b"], "rounds": [], "pattern": 3},
    "bad-threshold": {"nodes": ["a", "b"], "rounds": [[["a", "b"]]],
                      "judge": {"threshold": "high"}},
    "bad-reference": {"nodes": ["a", "b"], "rounds": [[["a", "b"]]],
                      "judge": {"reference": ["x"]}},
    "judge-not-a-dict": {"nodes": ["a", "b"], "rounds": [[["a", "b"]]], "judge": [1]},
}


def test_pair_plans_of_the_wrong_shape(tmp_path: Path, hostile_report) -> None:
    failures = []
    for name, plan in PLANS.items():
        results = tmp_path / name
        results.mkdir()
        (results / "plan.json").write_text(json.dumps(plan))
        for argv in (["pairs", "report", str(results)],
                     ["pairs", "retest-plan", str(results), "--pass", "1"]):
            try:
                proc = _run(argv, tmp_path)
            except subprocess.TimeoutExpired:
                failures.append(f"{name}: {argv}: no answer within {DEADLINE} s")
                continue
            problem = _clean_refusal(argv, proc, str(results / "plan.json"))
            if problem:
                failures.append(f"{name}: {problem}")
    hostile_report(f"pair plans of the wrong shape: {len(PLANS)} plans, {len(failures)} "
                   "problems")
    assert not failures, "\n".join(failures)


# files of a results directory that a report reads -> what it must be refused as
RESULT_FILES = {"round-01/a+b.out", "round-01/a+b.tasks", "round-01/a+b.rc", "retest-1.pairs",
                "gpu-a.json"}


def test_results_directories_with_links_to_devices(tmp_path: Path, hostile_report) -> None:
    """Each file of a results directory is read as what it is after following links: a
    symlink to /dev/zero (or a FIFO) in place of a step's output is an error naming it, within
    the memory limit, never gigabytes read."""
    plan = {"nodes": ["a", "b"], "rounds": [[["a", "b"]]], "gpu_stage": ["x"]}
    failures, runs = [], 0
    for index, (relative, kind) in enumerate(
            (r, k) for r in sorted(RESULT_FILES) for k in ("dev-zero", "fifo")):
        results = tmp_path / f"r{index}"
        (results / "round-01").mkdir(parents=True)
        (results / "plan.json").write_text(json.dumps(plan))
        target = results / relative
        if kind == "dev-zero":
            target.symlink_to("/dev/zero")
        else:
            os.mkfifo(target)
        for argv in (["pairs", "report", str(results)],
                     ["pairs", "retest-plan", str(results), "--pass", "1"]):
            if "gpu" in relative and "retest-plan" in argv:
                continue  # the retest plan does not read the GPU stage
            runs += 1
            try:
                proc = _run(argv, tmp_path)
            except subprocess.TimeoutExpired:
                failures.append(f"{relative} ({kind}): {argv}: no answer within {DEADLINE} s")
                continue
            problem = _clean_refusal(argv, proc, str(target))
            if problem:
                failures.append(f"{relative} ({kind}): {problem}")
    samples = tmp_path / "roce"
    samples.mkdir()
    (samples / "n1.0.json").symlink_to("/dev/zero")
    argv = ["roce", "report", str(samples)]
    runs += 1
    problem = _clean_refusal(argv, _run(argv, tmp_path), str(samples / "n1.0.json"))
    if problem:
        failures.append(problem)
    hostile_report(f"results directories with device links: {runs} runs, {len(failures)} "
                   "problems")
    assert not failures, "\n".join(failures)


STDIN_MAX_RSS = 256 << 20  # bounded readers keep at most a capped input (64 MB) in memory


def _run_stdin_zero(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, int]:
    """Run with /dev/zero on stdin; also return the child's peak resident set (bytes). The
    address-space limit alone would hide an unbounded read: the CLI turns the MemoryError
    at 1 GiB into a one-line error, after reading a gigabyte."""
    import tempfile
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    env.update(SLURMFABRIC_SITE_DEFAULTS="", SLURM_JOB_ID="7", SLURM_JOB_NODELIST="n1",
               SLURM_JOB_NUM_NODES="1")
    argv = [sys.executable, "-m", "slurmfabric", *argv]
    with open("/dev/zero", "rb") as zero, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=zero, stdout=out, stderr=err,
                                preexec_fn=_limits)
        deadline = time.monotonic() + DEADLINE
        while True:  # os.wait4: the child's own rusage (ru_maxrss, KiB on Linux)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise subprocess.TimeoutExpired(argv, DEADLINE)
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(argv, proc.returncode, out.read(), err.read())
    return done, usage.ru_maxrss * 1024


def test_standard_input_is_bounded(tmp_path: Path, hostile_report) -> None:
    """/dev/zero on stdin for every command that reads '-' (and every file argument given
    '-'): refused within the address-space limit and the deadline, never read whole."""
    subs = {"{GOOD_LINKS}": _good_links(), "{TMP}": str(tmp_path), "{IN}": "-"}
    runs = [[_fill(arg, subs) for arg in template] for template in COMMANDS
            if any("{IN}" in arg for arg in template)]
    runs += [["hostlist", action, "-"] for action in ("expand", "compress", "count")]
    runs += [["hostlist", "expand", "n1", "-"], ["nccl-log"]]
    failures = []
    for argv in runs:
        try:
            proc, peak = _run_stdin_zero(argv, tmp_path)
        except subprocess.TimeoutExpired:
            failures.append(f"{argv}: no answer within {DEADLINE} s")
            continue
        problem = _check(argv, proc)
        if problem:
            failures.append(problem)
        elif peak > STDIN_MAX_RSS or b"too large for memory" in proc.stderr:
            failures.append(f"{argv}: read stdin unbounded ({peak >> 20} MiB resident)")
    hostile_report(f"/dev/zero on stdin: {len(runs)} command runs, {len(failures)} problems")
    assert not failures, "\n".join(failures)
