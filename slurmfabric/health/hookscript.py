"""The shell wrappers Slurm runs as Prolog=, Epilog= and HealthCheckProgram=: one template.

A wrapper must fail open on every fault of slurmfabric itself, because Slurm drains a node
whose Prolog or Epilog exits non-zero (slurm.conf(5), "Prolog"; prolog_epilog.shtml) and a
cluster-wide install with a wrong path would otherwise drain every node at its next job.
Python cannot report its own absence, a broken venv or a crash, so the decision lives in
the wrapper, with this exit-code contract between the two sides:

==========================  ===================================================  ==========
``slurmfabric health HOOK``  meaning                                              wrapper
==========================  ===================================================  ==========
0                            the checks passed, or slurmfabric failed open itself  0
100 (``EXIT_NODE_BAD``)      a completed check run found the node bad and          1
                             drained it with its precise reason
anything else                not a verdict on the node: a traceback (1), a usage   0, logged
                             error (2), an internal error (70), not executable
                             (126), not found (127), over the hard time cap
                             (``timeout``: 124, or 137 after SIGKILL), a signal
                             (128+N)
==========================  ===================================================  ==========

100 is used by nothing else on the way: not by Python (1 for an uncaught exception, 2 for
usage), not by the shell (126/127/128+N), not by coreutils ``timeout`` (124-127, 137), not
by sysexits.h (64-78). A fault is logged as one line to syslog (``logger``, util-linux),
appended to the hook log, and the gauge ``slurmfabric_health_hook_error{node,hook}`` is set
to 1 in ``<prometheus_file>.hook.prom``, the file ``outputs.write_hook_error`` writes.

The scripts in ``prolog/``, ``epilog/`` and ``healthcheck/`` are this template rendered with
the defaults (a test holds them equal); ``health install-hooks`` renders it with the site's
paths. Every path is absolute: Slurm runs hooks as root with no PATH.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_NODE_BAD = 100

# kind (the script's directory and name) -> the ``slurmfabric health`` action it runs
HOOKS = {"prolog": "prolog", "epilog": "epilog", "healthcheck": "periodic"}

DEFAULT_BIN = "/usr/local/bin/slurmfabric"
DEFAULT_CONFIG = "/etc/slurmfabric/health.toml"
DEFAULT_LOG = "/var/log/slurmfabric/health.log"
DEFAULT_SYSLOG_SOCKET = "/dev/log"
# Above the runner's default budget (20 s) plus the state lock (10 s) and drain retries,
# below slurmd's 60 s kill of HealthCheckProgram (slurm.conf(5), HealthCheckInterval).
DEFAULT_MAX_SECONDS = 50

_HEADERS = {
    "prolog": (
        "# slurmfabric node health prolog. slurm.conf:  Prolog=/path/to/slurmfabric-prolog\n"
        "# Slurm runs this as root with no PATH and discards stdout; results go to syslog,\n"
        "# the hook log and the JSON report (see health.toml).\n"),
    "epilog": (
        "# slurmfabric node health epilog. slurm.conf:  Epilog=/path/to/slurmfabric-epilog\n"
        "# Slurm runs this as root with no PATH and discards stdout; results go to syslog,\n"
        "# the hook log and the JSON report (see health.toml).\n"),
    "healthcheck": (
        "# slurmfabric periodic node health check. slurm.conf:\n"
        "#   HealthCheckProgram=/path/to/slurmfabric-healthcheck\n"
        "#   HealthCheckInterval=300\n"
        "#   HealthCheckNodeState=ANY\n"
        "# slurmd runs this as root on idle and allocated nodes, ignores its exit code and\n"
        "# kills it after 60 s (slurm.conf(5)): it drains a failing node itself.\n"),
}

_BODY = r"""# Exit-code contract (slurmfabric/health/hookscript.py): 'slurmfabric health @ACTION@'
# exits 100 only when a completed check run found the node bad (it has drained the node
# with its reason); this script then exits 1. Any other failure is slurmfabric's own
# (missing binary, broken install, crash, signal, over the time cap): exit 0, one line to
# syslog and the hook log, and slurmfabric_health_hook_error 1. Never a drain.
# Written by 'slurmfabric health install-hooks'; these lines are the settings:
SLURMFABRIC_BIN=@BIN@
SLURMFABRIC_HEALTH_CONFIG=@CONFIG@
SLURMFABRIC_HOOK_LOG=@LOG@
SLURMFABRIC_HOOK_PROM=@PROM@
SLURMFABRIC_SYSLOG_SOCKET=@SOCKET@
SLURMFABRIC_HOOK_MAX_S=@MAX_S@
export SLURMFABRIC_HEALTH_CONFIG
hook=@ACTION@
node=${SLURMD_NODENAME:-$(/bin/hostname -s 2>/dev/null || /bin/uname -n)}
# stderr of the Python side, for the one line we log (mktemp: O_EXCL, never a user's link)
errfile=$(/bin/mktemp /tmp/slurmfabric-hook.XXXXXXXXXX 2>/dev/null) || errfile=""
cleanup() { [ -n "$errfile" ] && /bin/rm -f "$errfile"; }

fail_open() {
  msg="slurmfabric health $hook node=$node: $1, NOT draining (fail-open)"
  if [ -n "$errfile" ] && [ -s "$errfile" ] && [ -x /usr/bin/tail ]; then
    last=$(/usr/bin/tail -c 300 "$errfile" | /usr/bin/tail -n 1)
    [ -n "$last" ] && msg="$msg: $last"
  fi
  /usr/bin/logger -t slurmfabric-health -p daemon.err -u "$SLURMFABRIC_SYSLOG_SOCKET" \
    -- "$msg" 2>/dev/null
  if [ -n "$SLURMFABRIC_HOOK_LOG" ]; then
    printf '%s %s\n' "$(/bin/date +%Y-%m-%dT%H:%M:%S%z)" "$msg" \
      >>"$SLURMFABRIC_HOOK_LOG" 2>/dev/null
  fi
  if [ -n "$SLURMFABRIC_HOOK_PROM" ]; then
    prom=$SLURMFABRIC_HOOK_PROM
    case $prom in *"{node}"*) prom="${prom%%"{node}"*}$node${prom#*"{node}"}" ;; esac
    prom="${prom%.prom}.hook.prom"
    {
      echo "# HELP slurmfabric_health_hook_error 1: the last hook failed open on its own" \
        "config or internal error (nothing was checked); 0: it ran."
      echo "# TYPE slurmfabric_health_hook_error gauge"
      echo "slurmfabric_health_hook_error{node=\"$node\",hook=\"$hook\"} 1"
    } >"$prom.$$.tmp" 2>/dev/null && /bin/mv -f "$prom.$$.tmp" "$prom" 2>/dev/null
  fi
  echo "$msg" >&2
  cleanup
  exit 0
}

if [ ! -f "$SLURMFABRIC_BIN" ] || [ ! -x "$SLURMFABRIC_BIN" ]; then
  fail_open "$SLURMFABRIC_BIN is missing or not executable"
fi
if [ -x /usr/bin/timeout ]; then
  /usr/bin/timeout -k 5 "$SLURMFABRIC_HOOK_MAX_S" "$SLURMFABRIC_BIN" health "$hook" \
    </dev/null >/dev/null 2>"${errfile:-/dev/null}"
else
  "$SLURMFABRIC_BIN" health "$hook" </dev/null >/dev/null 2>"${errfile:-/dev/null}"
fi
rc=$?
case $rc in
  0) ;;
  100) cleanup; exit 1 ;;
  124) fail_open "slurmfabric ran past the hard cap of $SLURMFABRIC_HOOK_MAX_S s" ;;
  137) fail_open "slurmfabric was killed (SIGKILL: the hard cap's grace or the OOM killer)" ;;
  126|127) fail_open "$SLURMFABRIC_BIN could not be run (exit $rc)" ;;
  *)
    if [ "$rc" -gt 128 ]; then
      fail_open "slurmfabric was killed by signal $((rc - 128))"
    fi
    fail_open "slurmfabric failed on its own (exit $rc, not a check verdict)" ;;
esac
cleanup
exit 0
"""


@dataclass(frozen=True)
class HookPaths:
    """What a wrapper has baked in; every path absolute (hooks run with no PATH)."""

    bin: str = DEFAULT_BIN
    config: str = DEFAULT_CONFIG
    log: str = DEFAULT_LOG
    prometheus: str = ""
    syslog_socket: str = DEFAULT_SYSLOG_SOCKET
    max_seconds: int = DEFAULT_MAX_SECONDS


def render(kind: str, paths: HookPaths = HookPaths()) -> str:
    """The wrapper for ``kind`` (prolog, epilog, healthcheck); values shell-quoted."""
    body = _BODY
    for key, value in (("@BIN@", paths.bin), ("@CONFIG@", paths.config),
                       ("@LOG@", paths.log), ("@PROM@", paths.prometheus),
                       ("@SOCKET@", paths.syslog_socket),
                       ("@MAX_S@", str(int(paths.max_seconds))), ("@ACTION@", HOOKS[kind])):
        body = body.replace(key, _word(value))
    return "#!/bin/sh\n" + _HEADERS[kind] + body


def _word(value: str) -> str:
    """A shell word for an assignment or argument: bare when plainly safe, else quoted."""
    if value and all(c.isalnum() or c in "/._-+:,@" for c in value):
        return value
    import shlex  # install time only; the hook path imports this module for EXIT_NODE_BAD

    return shlex.quote(value)


__all__ = ["DEFAULT_MAX_SECONDS", "EXIT_NODE_BAD", "HOOKS", "HookPaths", "render"]


def check_binary(path: str) -> str:
    """The slurmfabric that the hooks will run, proven to run: ``PATH --version`` must print
    slurmfabric's version. A missing file, a broken venv or a wrong program is refused at
    install time, before Slurm would run it on every node. Returns the version line."""
    from slurmfabric._common.executable import probe
    from slurmfabric.errors import UsageError

    proc = probe("--bin", path, ["--version"],
                 "hooks run with no PATH; give e.g. /opt/slurmfabric/bin/slurmfabric",
                 "give the slurmfabric console script that the compute nodes have")
    first = (proc.stdout.strip().splitlines() or [""])[0]
    if proc.returncode != 0 or not first.startswith("slurmfabric "):
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise UsageError(f"--bin {path}: does not run as slurmfabric ('--version' gave: "
                         f"{why[:200]})", hint="reinstall it, or point --bin at a working one")
    return first


def install(dest: str, paths: HookPaths) -> list[str]:
    """Write slurmfabric-prolog, -epilog and -healthcheck into ``dest`` (mode 0755)."""
    from pathlib import Path

    from slurmfabric._common.files import write_atomic

    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in HOOKS:
        target = folder / f"slurmfabric-{kind}"
        write_atomic(target, render(kind, paths))
        target.chmod(0o755)
        written.append(str(target))
    return written


def install_hooks(dest: str, bin: str | None = None, config: str | None = None,
                  log: str | None = None, prometheus: str | None = None,
                  syslog_socket: str = DEFAULT_SYSLOG_SOCKET,
                  max_seconds: int = DEFAULT_MAX_SECONDS) -> list[str]:
    """``health install-hooks``: prove ``bin`` (default: this install's executable) runs,
    take the log and metrics paths the wrappers report fail-opens to from the config's
    [runner] (read leniently: a broken config must not stop the install that reports it),
    then write the three wrappers. Nothing is written when ``bin`` is refused."""
    from slurmfabric._common.executable import this_executable
    from slurmfabric.health import siteconfig

    exe = bin or this_executable()
    check_binary(exe)
    runner = siteconfig.salvage_runner(config)
    paths = HookPaths(
        bin=exe, config=config or DEFAULT_CONFIG,
        log=log if log is not None else str(runner["log_file"]),
        prometheus=prometheus if prometheus is not None else str(runner["prometheus_file"]),
        syslog_socket=syslog_socket, max_seconds=max_seconds)
    return install(dest, paths)
