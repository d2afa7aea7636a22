"""The Prolog/Epilog/HealthCheckProgram wrappers: every exit path of the contract.

Each case runs the real rendered wrapper with /bin/sh over a stand-in ``slurmfabric`` (a
script that exits, crashes, hangs or is missing) and reads what a site would see: the exit
code Slurm gets, the line logger(1) sent to a syslog socket (a real Unix datagram socket
bound here, as syslogd binds /dev/log), the hook log, and the hook-error gauge.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from syslogsink import SyslogSink

from slurmfabric.errors import UsageError
from slurmfabric.health import hookscript

NODE = "gpu042"


@pytest.fixture
def site(tmp_path):
    syslog = SyslogSink(tmp_path / "log.sock")
    yield tmp_path, syslog
    syslog.sock.close()


def wrapper(tmp: Path, kind: str, binary: str, max_seconds: int = 50) -> Path:
    paths = hookscript.HookPaths(
        bin=binary, config=str(tmp / "health.toml"), log=str(tmp / "hook.log"),
        prometheus=str(tmp / "prom" / "{node}.prom"), syslog_socket=str(tmp / "log.sock"),
        max_seconds=max_seconds)
    (tmp / "prom").mkdir(exist_ok=True)
    path = tmp / f"slurmfabric-{kind}"
    path.write_text(hookscript.render(kind, paths))
    path.chmod(0o755)
    return path


def stand_in(tmp: Path, body: str, mode: int = 0o755) -> str:
    """A fake slurmfabric: a script with ``body``; it records the argv it was given."""
    path = tmp / "bin" / "slurmfabric"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "$@" > {tmp}/argv\n{body}\n')
    path.chmod(mode)
    return str(path)


def run(script: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    # Slurm's hook environment: no PATH, the node's name and the job (prolog_epilog.shtml)
    env = {"SLURMD_NODENAME": NODE, "SLURM_JOB_ID": "17", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}
    return subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_failed_open(tmp: Path, syslog: SyslogSink, proc, hook: str, words: str) -> None:
    assert proc.returncode == 0, proc.stderr
    lines = syslog.lines()
    assert len(lines) == 1, lines
    assert "slurmfabric-health:" in lines[0] and lines[0].startswith("<27>")  # daemon.err
    assert f"slurmfabric health {hook} node={NODE}: " in lines[0] and words in lines[0], lines
    assert "NOT draining (fail-open)" in lines[0]
    log = (tmp / "hook.log").read_text()
    assert log.count("\n") == 1 and words in log, log
    gauge = (tmp / "prom" / f"{NODE}.hook.prom").read_text()
    assert f'slurmfabric_health_hook_error{{node="{NODE}",hook="{hook}"}} 1' in gauge


def test_node_bad_is_the_only_non_zero_exit(site) -> None:
    tmp, syslog = site
    proc = run(wrapper(tmp, "prolog", stand_in(tmp, "exit 100")))
    assert proc.returncode == 1
    assert syslog.lines() == [] and not (tmp / "hook.log").exists()
    assert (tmp / "argv").read_text().split() == ["health", "prolog"]


@pytest.mark.parametrize("kind,hook", [("prolog", "prolog"), ("epilog", "epilog"),
                                       ("healthcheck", "periodic")])
def test_a_passing_run_exits_0_and_logs_nothing(site, kind, hook) -> None:
    tmp, syslog = site
    proc = run(wrapper(tmp, kind, stand_in(tmp, "exit 0")))
    assert proc.returncode == 0 and syslog.lines() == []
    assert (tmp / "argv").read_text().split() == ["health", hook]


def test_missing_binary_fails_open(site) -> None:
    tmp, syslog = site
    proc = run(wrapper(tmp, "prolog", "/nonexistent/slurmfabric"))
    assert_failed_open(tmp, syslog, proc, "prolog",
                       "/nonexistent/slurmfabric is missing or not executable")


def test_binary_not_executable_fails_open(site) -> None:
    tmp, syslog = site
    proc = run(wrapper(tmp, "epilog", stand_in(tmp, "exit 100", mode=0o644)))
    assert_failed_open(tmp, syslog, proc, "epilog", "is missing or not executable")


def test_a_directory_as_binary_fails_open(site) -> None:
    tmp, syslog = site
    proc = run(wrapper(tmp, "prolog", str(tmp)))
    assert_failed_open(tmp, syslog, proc, "prolog", "is missing or not executable")


def test_missing_interpreter_fails_open(site) -> None:
    """A venv whose python went away (interpreter upgraded): the shebang cannot run."""
    tmp, syslog = site
    path = tmp / "venv-slurmfabric"
    path.write_text("#!/nonexistent/venv/bin/python3\nimport slurmfabric\n")
    path.chmod(0o755)
    proc = run(wrapper(tmp, "prolog", str(path)))
    assert_failed_open(tmp, syslog, proc, "prolog", "could not be run (exit 127)")


def test_import_failure_fails_open_with_the_error(site) -> None:
    """A real interpreter whose package is gone: a traceback and exit 1 are not a verdict."""
    tmp, syslog = site
    path = tmp / "broken-slurmfabric"
    path.write_text(f"#!{sys.executable}\nimport slurmfabric_removed_package\n")
    path.chmod(0o755)
    proc = run(wrapper(tmp, "prolog", str(path)))
    assert_failed_open(tmp, syslog, proc, "prolog", "failed on its own (exit 1")
    assert "ModuleNotFoundError: No module named 'slurmfabric_removed_package'" in \
        (tmp / "hook.log").read_text()


@pytest.mark.parametrize("code", [2, 70, 99, 101, 125])
def test_any_other_exit_code_fails_open(site, code) -> None:
    tmp, syslog = site
    proc = run(wrapper(tmp, "epilog", stand_in(tmp, f"exit {code}")))
    assert_failed_open(tmp, syslog, proc, "epilog", f"(exit {code}, not a check verdict)")


def test_a_crash_by_signal_fails_open(site) -> None:
    tmp, syslog = site
    proc = run(wrapper(tmp, "prolog", stand_in(tmp, "kill -SEGV $$")))
    assert_failed_open(tmp, syslog, proc, "prolog", "killed by signal 11")


def test_past_the_hard_cap_fails_open_on_time(site) -> None:
    tmp, syslog = site
    script = wrapper(tmp, "prolog", stand_in(tmp, "exec sleep 60"), max_seconds=1)
    start = time.monotonic()
    proc = run(script)
    elapsed = time.monotonic() - start
    assert_failed_open(tmp, syslog, proc, "prolog", "past the hard cap of 1 s")
    assert elapsed < 1 + 10, elapsed  # the cap plus a loaded machine's margin; not 60 s


def test_ignoring_sigterm_is_killed_after_the_grace(site) -> None:
    tmp, syslog = site
    script = wrapper(tmp, "prolog", stand_in(tmp, "trap '' TERM; sleep 30 & wait; sleep 30"),
                     max_seconds=1)
    proc = run(script, timeout=40)
    assert_failed_open(tmp, syslog, proc, "prolog", "was killed (SIGKILL: the hard cap")


def test_the_wrapper_leaves_no_temporary_file(site) -> None:
    tmp, _ = site
    before = set(os.listdir("/tmp"))
    run(wrapper(tmp, "prolog", stand_in(tmp, "echo noise >&2; exit 3")))
    run(wrapper(tmp, "prolog", stand_in(tmp, "exit 100")))
    assert not {n for n in set(os.listdir("/tmp")) - before if n.startswith("slurmfabric-hook")}


def test_shipped_scripts_are_the_template_with_defaults() -> None:
    root = Path(__file__).resolve().parents[2]
    for kind in hookscript.HOOKS:
        shipped = (root / kind / f"slurmfabric-{kind}").read_text()
        assert shipped == hookscript.render(kind), (
            f"{kind}/slurmfabric-{kind} is stale: write hookscript.render({kind!r}) to it")
        subprocess.run(["sh", "-n", str(root / kind / f"slurmfabric-{kind}")], check=True)


def test_values_are_data_in_the_script(tmp_path) -> None:
    """A path with spaces, quotes and $ is baked as one literal word."""
    odd = str(tmp_path / "a b'$(touch pwned)")
    text = hookscript.render("prolog", hookscript.HookPaths(bin=odd, config=odd))
    script = tmp_path / "p.sh"
    script.write_text(text.replace("hook=prolog", 'echo "$SLURMFABRIC_BIN"; exit 0\nhook=prolog'))
    out = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True,
                         cwd=tmp_path).stdout
    assert out.strip() == odd and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("binary,words", [
    ("/nonexistent/slurmfabric", "no such executable file"),
    ("relative/slurmfabric", "must be an absolute path"),
    ("/bin/false", "does not run as slurmfabric"),
])
def test_install_hooks_refuses_a_binary_that_does_not_run(tmp_path, binary, words) -> None:
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "install-hooks",
                           str(tmp_path / "hooks"), "--bin", binary],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr.splitlines()[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "hooks").exists()


def test_install_hooks_bakes_the_config_paths(tmp_path) -> None:
    cfg = tmp_path / "health.toml"
    cfg.write_text('[runner]\nlog_file = "/var/log/sf/h.log"\n'
                   'prometheus_file = "/var/lib/ne/{node}.prom"\n')
    exe = str(Path(sys.executable).parent / "slurmfabric")
    proc = subprocess.run([exe, "health", "install-hooks", str(tmp_path / "hooks"), "--bin",
                           exe, "--config", str(cfg)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "hooks" / "slurmfabric-epilog").read_text()
    assert "SLURMFABRIC_HOOK_LOG=/var/log/sf/h.log\n" in text
    assert "SLURMFABRIC_HOOK_PROM='/var/lib/ne/{node}.prom'\n" in text
    assert f"SLURMFABRIC_BIN={exe}\n" in text


def test_install_hooks_in_the_library_takes_defaults_from_the_config(tmp_path) -> None:
    """hookscript.install_hooks owns the install (the command only prints its paths): the
    config's [runner] paths unless given, explicit values win, a refused --bin writes
    nothing."""
    cfg = tmp_path / "health.toml"
    cfg.write_text('[runner]\nlog_file = "/var/log/sf/h.log"\n'
                   'prometheus_file = "/var/lib/ne/n.prom"\n')
    exe = str(Path(sys.executable).parent / "slurmfabric")
    written = hookscript.install_hooks(str(tmp_path / "hooks"), bin=exe, config=str(cfg),
                                       prometheus="", max_seconds=30)
    assert [Path(p).name for p in written] == [f"slurmfabric-{k}" for k in hookscript.HOOKS]
    text = Path(written[0]).read_text()
    assert text == hookscript.render("prolog", hookscript.HookPaths(
        bin=exe, config=str(cfg), log="/var/log/sf/h.log", prometheus="", max_seconds=30))
    with pytest.raises(UsageError, match="does not run as slurmfabric"):
        hookscript.install_hooks(str(tmp_path / "none"), bin="/bin/false")
    assert not (tmp_path / "none").exists()
