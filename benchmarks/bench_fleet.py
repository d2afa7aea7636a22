"""Fleet-wide fault drills on the local Slurm testbed: what a fault on every node at once
does to the breaker and to slurmctld.

Each drill installs the health Prolog (``health install-hooks``) through slurm.conf and
submits one job across every node, so slurmd starts all prologs at the same moment
(PrologFlags=Alloc). A thin timing wrapper around the installed prolog records each hook's
start, end and exit code in a file; nothing polls slurmctld while the hooks run, so the
RPCs ``sdiag`` counts after ``sdiag --reset`` (sdiag(1)) are the hooks' and the job's own.
Drills:

- ``healthy``: every check passes (the baseline: hooks must make 0 slurmctld calls);
- ``same-check``: every node's nvidia-smi reports the same uncorrected ECC error;
- ``broken-config``: the shared health.toml has a typo (hooks must fail open, no drain);
- ``hung-tool``: nvidia-smi hangs on every node (the probe deadline, then a drain).

Per drill: nodes drained (by slurmfabric or by Slurm's "Prolog error"; must be at most the
breaker limit), the time from the first hook's start until the last hook ended (every
breaker undo happens inside its hook, before it exits), the hook-caused slurmctld RPCs per
hook (``HOOK_RPCS``) and the p50/p99 hook wall time.

Standalone (as root; its own state directory and ports, beside a running testbed):
    python benchmarks/bench_fleet.py --nodes 4 64
tests/cluster/test_fleet_cluster.py runs the same drills as tests.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurmfabric.slurm import cmd
from slurmfabric.testbed import Settings, Testbed, write_extra_conf

ROOT = Path(__file__).resolve().parents[1]
NVSMI = ROOT / "tests" / "fixtures" / "health" / "nvsmi"
DRILLS = ("healthy", "same-check", "broken-config", "hung-tool")
# The RPCs a hook causes: 'scontrol show -o node' (all nodes, or one) and 'scontrol update'.
HOOK_RPCS = ("REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_UPDATE_NODE")
_RPC_LINE = re.compile(r"^\s+([A-Z][A-Z0-9_]+)\s+\(\s*\d+\)\s+count:(\d+)")


@dataclass
class DrillResult:
    drill: str
    nodes: int
    limit: int
    drained: list[str]
    hook_s: list[float]
    exit_codes: list[int]
    span_s: float
    rpcs: dict[str, int] = field(default_factory=dict)

    @property
    def hook_rpcs(self) -> int:
        return sum(self.rpcs.get(name, 0) for name in HOOK_RPCS)

    @property
    def rpcs_per_hook(self) -> float:
        return self.hook_rpcs / max(1, len(self.hook_s))

    def pct(self, q: float) -> float:
        """The q-quantile of the hook wall times (nearest rank)."""
        ordered = sorted(self.hook_s)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else float("nan")


def breaker_limit(nodes: int, fraction: float = 0.1, min_nodes: int = 3) -> int:
    """The breaker's limit for a cluster of ``nodes`` (drain.breaker_tripped's formula)."""
    return max(int(min_nodes), math.ceil(fraction * nodes))


def sdiag_counts(env: dict[str, str]) -> dict[str, int]:
    """RPC counts by message type from ``sdiag`` (since the last ``sdiag --reset``)."""
    out = cmd.run(["sdiag"], env=env)
    section = out.split("by message type", 1)[-1].split("by user", 1)[0]
    return {m.group(1): int(m.group(2)) for m in map(_RPC_LINE.match, section.splitlines())
            if m}


def fleet_settings(state_dir: Path, nodes: int, prefix: str, ctld_port: int,
                   node_port_base: int, addr_prefix: str, accounting: bool) -> Settings:
    return Settings(state_dir=state_dir, nodes=nodes, prefix=prefix, ctld_port=ctld_port,
                    node_port_base=node_port_base, addr_prefix=addr_prefix,
                    cluster_name="sffleet", accounting=accounting,
                    dbd_port=ctld_port + 2, db_port=ctld_port + 13)


def daemon_memory(testbed: Testbed) -> dict[str, float]:
    """MiB of the testbed's daemons: summed RSS (shared pages counted per process) and
    PSS (shared pages split between the processes that map them: the real footprint);
    Slurm's daemons (munged, slurmctld, slurmd) apart from slurmdbd and MariaDB."""
    totals = {"slurm_rss": 0.0, "slurm_pss": 0.0, "dbd_rss": 0.0, "dbd_pss": 0.0}
    for key, pid in testbed.running().items():
        kind = "dbd" if key in ("slurmdbd", "mariadbd") else "slurm"
        for name, path in (("rss", f"/proc/{pid}/status"), ("pss", f"/proc/{pid}/smaps_rollup")):
            try:
                text = Path(path).read_text()
            except OSError:
                continue
            label = "VmRSS:" if name == "rss" else "Pss:"
            kb = next((int(line.split()[1]) for line in text.splitlines()
                       if line.startswith(label)), 0)
            totals[f"{kind}_{name}"] += kb / 1024
    return totals


def bring_up(settings: Settings, timeout: float = 240) -> tuple[Testbed, float]:
    """Stop whatever runs in ``settings.state_dir`` and start this cluster; return it and
    the seconds until every node was idle."""
    Testbed.from_state(settings.state_dir).down(log=lambda m: None)
    testbed = Testbed(settings)
    t0 = time.monotonic()
    testbed.up(timeout=timeout, log=lambda m: None)
    return testbed, time.monotonic() - t0


def _shim(work: Path) -> str:
    """The slurmfabric the hooks run: this checkout's, with bytecode kept out of it (slurmd
    runs hooks with an environment of its own)."""
    prefix = os.environ.get("PYTHONPYCACHEPREFIX") or str(work / "pycache")
    path = work / "bin" / "slurmfabric"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} "
                    f"PYTHONPYCACHEPREFIX={shlex.quote(prefix)} "
                    f'exec {shlex.quote(sys.executable)} -m slurmfabric "$@"\n')
    path.chmod(0o755)
    return str(path)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def health_config(path: Path, work: Path, nodes: list[str], scenario: str,
                  env: dict[str, str], broken: bool = False, **runner: object) -> Path:
    """A health.toml for the drill: per-node state ({node}), the recorded nvidia-smi of
    ``scenario`` on every node, RDMA off (the testbed has none)."""
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    settings = {"state_dir": str(work / "state" / "{node}"), "log_file": str(work / "hook.log"),
                "syslog": False, "prometheus_file": str(work / "prom" / "{node}.prom"),
                "slurm_bin_dir": str(Path(scontrol or "/usr/bin/scontrol").parent),
                "probe_timeout_s": 8.0, "budget_s": 20.0, "drain_retry_s": 0.2, **runner}
    lines = ["[runner]"] + [f"{k} = {_toml(v)}" for k, v in settings.items()]
    if broken:  # the typo a cluster-wide edit makes: a number as a string
        lines.append('lock_timeout_s = "10"')
    lines += ["", "[[nodes]]", f"match = {_toml(','.join(nodes))}", "gpus = 8",
              'gpu_source = "nvidia-smi"', f"nvidia_smi = {_toml(NVSMI / scenario / 'nvidia-smi')}",
              "rdma_ports = 0"]
    path.write_text("\n".join(lines) + "\n")
    return path


def install_prolog(work: Path, config: Path, env: dict[str, str]) -> Path:
    """``health install-hooks`` with this config, and a timing wrapper around its prolog
    that leaves ``times/<node>`` = "start end exit" (date +%s.%N)."""
    exe = _shim(work)
    cmd.run([exe, "health", "install-hooks", str(work / "hooks"), "--bin", exe,
                  "--config", str(config), "--max-seconds", "40"], env=env, timeout=120)
    # Warm the bytecode cache once, as an installed package has it: the first hook would
    # otherwise compile slurmfabric on every node at once.
    subprocess.run([exe, "health", "check", "--config", str(config)], env=env, timeout=120,
                   capture_output=True, check=False)
    times = work / "times"
    times.mkdir(exist_ok=True)
    wrapper = work / "timed-prolog"
    prolog, out = shlex.quote(str(work / "hooks" / "slurmfabric-prolog")), shlex.quote(str(times))
    wrapper.write_text(
        "#!/bin/sh\n# drill timing around the installed prolog (bench_fleet.py)\n"
        "t0=$(/bin/date +%s.%N)\n"
        f"{prolog}\nrc=$?\n"
        "t1=$(/bin/date +%s.%N)\n"
        f'echo "$t0 $t1 $rc" > {out}/"$SLURMD_NODENAME".tmp && '
        f'/bin/mv {out}/"$SLURMD_NODENAME".tmp {out}/"$SLURMD_NODENAME"\n'
        "exit $rc\n")
    wrapper.chmod(0o755)
    return wrapper


def _wait(predicate: Callable[[], object], timeout: float, what: str, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def _reconfigure(testbed: Testbed, text: str) -> None:
    write_extra_conf(testbed.s, text)
    cmd.run(["scontrol", "reconfigure"], env=testbed.env())
    time.sleep(1.0)  # slurmd rereads asynchronously


def _drained(env: dict[str, str]) -> list[str]:
    return sorted(r["NodeName"] for r in cmd.show("node", env=env)
                  if cmd.node_state_flags(r.get("State", "")) & {"DRAIN", "DRAINED",
                                                                       "DRAINING"})


def settle(testbed: Testbed, timeout: float = 120) -> None:
    """Hooks off, every job gone, every node resumed and idle: the start of a drill."""
    env = testbed.env()
    _reconfigure(testbed, "")
    cmd.run(["scancel", "--partition", testbed.s.partition], env=env)
    for name in _drained(env):
        cmd.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], env=env)
    testbed.wait_idle(timeout)


def run_drill(testbed: Testbed, drill: str, work: Path, timeout: float = 180) -> DrillResult:
    """One drill on every node of ``testbed``; leaves the cluster settled again."""
    env, nodes = testbed.env(), testbed.s.node_names
    work.mkdir(parents=True, exist_ok=True)
    scenario = {"same-check": "h100-535-ecc", "hung-tool": "hang"}.get(drill, "h100-535-healthy")
    config = health_config(work / "health.toml", work, nodes, scenario, env,
                           broken=drill == "broken-config")
    wrapper = install_prolog(work, config, env)
    settle(testbed)
    _reconfigure(testbed, f"Prolog={wrapper}\n")
    cmd.run(["sdiag", "--reset"], env=env)
    job = cmd.sbatch("#!/bin/sh\ntrue\n", ["-N", str(len(nodes)), "-t", "5",
                                                 "-o", "/dev/null", "-J", f"drill-{drill}"],
                          workdir=work, env=env).job_id
    times = work / "times"
    _wait(lambda: len(list(times.glob(f"{testbed.s.prefix}*"))) >= len(nodes), timeout,
          f"the {drill} prologs on {len(nodes)} nodes", step=0.5)
    rpcs = sdiag_counts(env)  # before anything of ours asks slurmctld again
    rows = {p.name: p.read_text().split() for p in times.iterdir() if not p.name.endswith(".tmp")}
    starts = [float(r[0]) for r in rows.values()]
    ends = [float(r[1]) for r in rows.values()]
    drained = _drained(env)
    cmd.run(["scancel", job], env=env)
    settle(testbed)
    return DrillResult(drill, len(nodes), breaker_limit(len(nodes)), drained,
                       [float(r[1]) - float(r[0]) for r in rows.values()],
                       [int(r[2]) for r in rows.values()], max(ends) - min(starts), rpcs)


HEADER = ("nodes", "drill", "drained", "limit", "settle s", "RPC/hook", "hook p50 s",
          "hook p99 s")


def table(results: list[DrillResult]) -> str:
    """A Markdown table of the drills (the figures quoted in docs/health.md)."""
    rows = [HEADER, tuple("---" for _ in HEADER)]
    for r in results:
        rows.append((str(r.nodes), r.drill, str(len(r.drained)), str(r.limit),
                     f"{r.span_s:.1f}", f"{r.rpcs_per_hook:.2f}", f"{r.pct(0.5):.2f}",
                     f"{r.pct(0.99):.2f}"))
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--state-dir", default="/var/tmp/slurmfabric-bench-fleet")
    parser.add_argument("--prefix", default="sfq")
    parser.add_argument("--ctld-port", type=int, default=18117)
    parser.add_argument("--node-port-base", type=int, default=18201)
    parser.add_argument("--addr-prefix", default="127.0.76.")
    args = parser.parse_args()
    results = []
    for count in args.nodes:
        settings = fleet_settings(Path(args.state_dir), count, args.prefix, args.ctld_port,
                                  args.node_port_base, args.addr_prefix, accounting=False)
        testbed, up_s = bring_up(settings)
        mem = daemon_memory(testbed)
        print(f"testbed up -n {count}: all idle in {up_s:.1f} s; daemons RSS "
              f"{mem['slurm_rss']:.0f} MiB, PSS {mem['slurm_pss']:.0f} MiB", flush=True)
        try:
            work = Path(tempfile.mkdtemp(prefix=f"fleet-{count}-", dir="/var/tmp"))
            for drill in DRILLS:
                results.append(run_drill(testbed, drill, work / drill))
                print(table(results[-1:]).splitlines()[-1], flush=True)
        finally:
            testbed.down(log=lambda m: None)
    print(table(results))


if __name__ == "__main__":
    main()
