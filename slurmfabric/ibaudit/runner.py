"""Run the infiniband-diags tools with deadlines; return their raw text.

The tools talk MADs to the fabric and can hang on an unresponsive port or a dead SM, so
every call runs in its own process group with a deadline and is killed as a group when the
deadline passes (``slurmfabric._common.probe``, shared with the health probes). Paths and extra
arguments are configurable because sites install the tools under /usr/sbin,
/opt/mellanox/... or wrap them (and the simulated fabric in the tests needs
``LD_PRELOAD``). Parsing lives in :mod:`slurmfabric.ibaudit.parse`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from slurmfabric._common import probe as _probe
from slurmfabric.errors import TopologyError

TOOLS = ("iblinkinfo", "perfquery", "ibstat", "ibroute")


@dataclass
class Tools:
    """Where the tools are and how to call them.

    ``extra_args`` go after the tool name on every call (for example ``-C mlx5_0 -P 1`` to
    pick the local port used to reach the fabric); ``env`` is merged over os.environ.
    """

    paths: dict[str, str] = field(default_factory=lambda: {t: t for t in TOOLS})
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 60.0
    jobs: int = 8
    cwd: str | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Tools:
        """Defaults overridden by ``SLURMFABRIC_<TOOL>`` paths and ``SLURMFABRIC_IBDIAG_ARGS``."""
        environ = dict(os.environ if environ is None else environ)
        tools = cls()
        for name in TOOLS:
            path = environ.get(f"SLURMFABRIC_{name.upper()}")
            if path:
                tools.paths[name] = path
        args = environ.get("SLURMFABRIC_IBDIAG_ARGS", "")
        from slurmfabric._common.textcheck import split_args

        tools.extra_args = split_args(args, "SLURMFABRIC_IBDIAG_ARGS")
        return tools

    def command(self, tool: str, args: Iterable[str]) -> list[str]:
        return [self.paths.get(tool, tool), *self.extra_args, *args]


def run_tool(tools: Tools, tool: str, args: Iterable[str] = ()) -> str:
    """Run one tool and return its stdout; raise TopologyError quoting its stderr."""
    cmd = tools.command(tool, args)
    env = {**os.environ, **tools.env}
    try:
        done = _probe.run(cmd, tools.timeout, env=env, cwd=tools.cwd)
    except FileNotFoundError as exc:
        raise TopologyError(
            f"{cmd[0]}: not found",
            hint=f"install infiniband-diags or pass --{tool} PATH (or SLURMFABRIC_{tool.upper()})",
        ) from exc
    except _probe.Deadline as exc:
        stuck = " (stuck in uninterruptible sleep, state D)" if exc.state == "D" else ""
        raise TopologyError(
            f"{shlex.join(cmd)}: no answer within {tools.timeout:g}s{stuck}",
            hint="a hung port or subnet manager; raise --timeout or check the SM with sminfo",
        ) from exc
    if done.returncode != 0:
        detail = " ".join(line for line in done.stderr.strip().splitlines()[-3:] if line)
        raise TopologyError(f"{shlex.join(cmd)} failed (exit {done.returncode}): {detail}")
    return done.stdout


def iblinkinfo(tools: Tools) -> str:
    """``iblinkinfo --line``: one line per port with both ends' GUIDs."""
    return run_tool(tools, "iblinkinfo", ["--line"])


def lfts(tools: Tools, switch_lids: Iterable[int]) -> str:
    """Every switch's unicast LFT (``ibroute LID``), concatenated as dump_lfts.sh does."""
    lids = sorted(set(switch_lids))
    with ThreadPoolExecutor(max_workers=max(1, tools.jobs)) as pool:
        return "".join(pool.map(lambda lid: run_tool(tools, "ibroute", [str(lid)]), lids))


def ibstat(tools: Tools) -> str:
    return run_tool(tools, "ibstat")


def perfquery(tools: Tools, lid: int, port: int, extended: bool) -> str:
    args = ["-x"] if extended else []
    return run_tool(tools, "perfquery", [*args, str(lid), str(port)])


def port_counters(tools: Tools, lid: int, port: int) -> str:
    """``perfquery -x`` for the port, plus plain ``perfquery`` when -x lacks error counters.

    Ports without IsAdditionalPortCountersExtendedSupported (older HCAs, the simulator)
    print only data counters under -x; the error counters then come from PortCounters.
    """
    text = perfquery(tools, lid, port, extended=True)
    if "SymbolErrorCounter" not in text:
        text += "\n" + perfquery(tools, lid, port, extended=False)
    return text


def collect_counters(
    tools: Tools, targets: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], str | TopologyError]:
    """Query many ports concurrently; a failed port yields its error instead of raising."""
    targets = sorted(set(targets))

    def one(target: tuple[int, int]) -> str | TopologyError:
        try:
            return port_counters(tools, *target)
        except TopologyError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, tools.jobs)) as pool:
        return dict(zip(targets, pool.map(one, targets)))


def collect_link_counters(
    tools: Tools, links: Iterable[object]
) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Counters for both ends of every link, keyed ``"<guid>:<port>"``; plus error lines.

    A port whose query fails is reported (the audit still runs on the rest): on a big fabric
    one unreachable port must not hide every other finding.
    """
    from slurmfabric.ibaudit.parse import merge_counters, parse_perfquery

    wanted: dict[tuple[int, int], str] = {}
    for link in links:
        for end in (link.a, link.b):  # type: ignore[attr-defined]
            if end.lid > 0:
                wanted[(end.lid, end.port)] = end.key
    results = collect_counters(tools, wanted)
    counters: dict[str, dict[str, int]] = {}
    errors: list[str] = []
    for target, text in results.items():
        if isinstance(text, TopologyError):
            errors.append(str(text))
            continue
        try:
            counters[wanted[target]] = merge_counters(parse_perfquery(text))
        except TopologyError as exc:
            errors.append(f"lid {target[0]} port {target[1]}: {exc}")
    return counters, errors
