"""Read ``NCCL_DEBUG=INFO`` output from one or many ranks and say what the fabric did.

Operators grep these logs by eye for ``NET/IB`` + ``GDRDMA`` and dread a silent
``NET/Socket`` fallback. This module turns the log into per-rank facts (version, network,
devices, GPUDirect RDMA, channels) and a list of problems with the remedy.

Line formats handled (all seen in public NVIDIA/nccl and nccl-tests issues, NCCL 2.3-2.28;
one real log per release family in tests/fixtures/nccl/versions/, sources in its SOURCES.md):

* ``host:pid:tid [dev] NCCL INFO msg`` and ``host:pid:tid [dev] file.cc:123 NCCL WARN msg``;
* the same behind launcher labels: ``[1,23]<stdout>:`` (mpirun --tag-output), ``0: ``
  (srun -l), ``[3] `` (a rank label), or timestamps;
* ``[0] NCCL INFO msg`` without the host prefix (older logs, NCCL_DEBUG_FILE per rank), and
  ``host [0] NCCL INFO msg`` with the host only (a log collector's format);
* merged NICs in the ``NET/IB : Using`` line (2.20-2.23, HPC-X's plugin) and ``Made virtual
  device`` lines (2.24+); nccl-tests' ``# Rank N ... on HOST`` table in the same output;
* a bare ``NCCL version 2.19.3+cuda12.3`` line (printed by rank 0 of nccl-tests).
Pure functions over text, standard library only; what a WARN means: nccl/problems.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from slurmfabric.nccl.problems import Problem, classify_warning, crash, timeout_problem

# The marker every NCCL line has; the text before it (host:pid:tid and launcher labels) is
# split off by _split_prefix. Two steps, not one regex with a lazy prefix: that one
# backtracks quadratically on a long line with no marker (a 64 KiB line took 30 s).
_MARK = re.compile(
    r"\[(?P<dev>[0-9]{1,9})\]\s+"
    r"(?:(?P<src>\S+:[0-9]+)\s+)?"
    r"NCCL (?P<level>INFO|WARN|ERROR|TRACE|ABORT)\b\s?"
)
_TAGGED = re.compile(r"\[\d+,(?P<rank>[0-9]{1,9})\]<std(?:out|err)>:\s*$")  # mpirun --tag-output
_SRUN_LABEL = re.compile(r"^\s*(?P<rank>[0-9]{1,9}):\s*$")  # srun --label
_RANK_LABEL = re.compile(r"\[(?P<rank>[0-9]{1,9})\]\s*$")
_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+\S*)")
# nccl-tests' device table in the same output ("#  Rank  0 Group  0 Pid 8756 on Meowth
# device  0 [0x01] ..."; no "Group" before nccl-tests 2.13): every rank of the job, its host.
_TESTS_RANK = re.compile(r"#\s+Rank\s+(?P<rank>[0-9]{1,9})\s+(?:Group\s+[0-9]{1,9}\s+)?Pid\s+"
                         r"[0-9]{1,9}\s+on\s+(?P<host>\S{1,255})\s+device\s")
_OOB = re.compile(r";\s*OOB (\S+)\s*$")
_COMM = re.compile(r"comm 0x[0-9a-f]+ rank ([0-9]{1,9}) nranks ([0-9]{1,9}) cudaDev [0-9]")
# init.cc since 2.12: "comm 0x... rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 ..."
_NODES = re.compile(r"comm 0x[0-9a-f]+ rank [0-9]{1,9} nRanks ([0-9]{1,9}) nNodes ([0-9]{1,9})")
_LIST_ITEM = re.compile(r"\[\d+\](\S+)")
# One NET/IB device in the "Using" list: "[0]mlx5_0:1/IB" (every release; 2.29+ may add
# ":rail" or "::plane" after the port), or a merged NIC, "[0]={[0] mlx5_2:1/RoCE, [1]
# mlx5_3:1/RoCE}" (net_ib.cc of NCCL 2.20-2.23 and HPC-X's IBext plugin).
_IB_DEVICE = re.compile(r"\[\d{1,4}\](?:=\{(?P<merged>[^{}]{0,4000})\}|(?P<dev>[^\s\[\]{}]+))")
_MERGED_MEMBER = re.compile(r"\[\d{1,4}\]\s*([^\s,{}\[\]]+)")
# 2.24+: merged NICs are virtual devices, printed once each (src/transport/net_ib.cc):
# "NET/IB : Made virtual device [8] name=mlx5_0+mlx5_1 speed=400000 ndevs=2".
_VIRTUAL = re.compile(r"NET/IB ?: Made virtual device \[\d{1,4}\] name=(?P<name>\S+) "
                      r"speed=\d+ ndevs=(?P<n>[0-9]{1,3})")
_NET_VIA = re.compile(
    r"^NET/(?P<net>.+?)/(?P<dev>[0-9]{1,9})(?:\((?P<merged>[0-9]{1,9})\))?(?P<gdr>/GDRDMA)?(?:/\S*)?$"
)
_GDR_LINE = re.compile(
    r"GPU Direct RDMA (?P<state>Enabled|Disabled) for (?:GPU \S+ / )?HCA (?P<hca>[0-9]{1,9})"
    r"(?: '(?P<name>[^']*)')?(?P<rest>.*)$"
)
# NCCL's error propagation: each function that returns an error prints "file.cc:LINE -> N"
# as INFO on its way up (NCCLCHECK in src/include/checks.h), N an ncclResult_t.
_CHAIN = re.compile(r"^(?P<src>[^\s:]{1,200}:[0-9]{1,6}) -> (?P<code>[0-9]{1,3})(?P<tail>\s.*)?$")
# ncclResult_t (src/nccl.h.in; the same values in ext-profiler/inspector/nccl/common.h of
# NVIDIA/nccl): 7 (ncclInProgress) is a non-blocking communicator still initialising, not
# an error.
NCCL_RESULT = {
    1: "ncclUnhandledCudaError (a CUDA call failed)",
    2: "ncclSystemError (a system call failed: memory, sockets, verbs)",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError (a peer failed or went away)",
}
# Frames whose failure means the communicator (its init, a group call or a collective) or
# the proxy thread failed. A chain that stops below them was handled: NCCL 2.4 prints
# "include/net.h:24 -> 2" when a plugin has no PCI path for a NIC, and carries on.
# bootstrap.cc is one of them: the bootstrap (the out-of-band ring every rank joins before
# init) has no fallback, an error there ends the communicator's init, and a log often stops
# at it (NVIDIA/nccl#1920: "bootstrap.cc:868 -> 6 ncclSocketConnect()", then nothing).
_TOP_FRAMES = ("init.cc", "group.cc", "enqueue.cc", "collectives.cc", "init.cu",
               "bootstrap.cc")
# WARNs that are failures by themselves: the proxy could not connect a peer.
_FATAL_WARNS = ("Failed to execute operation", "Error encountered progressing operation")
# The proxy's progress thread tags the last step of its chain: "[Proxy Thread]" up to
# 2.18 (NVIDIA/nccl#928), "[Progress Thread]" since.
_PROXY_THREAD_TAGS = ("Progress Thread", "Proxy Thread")
@dataclass
class RankInfo:
    """What one NCCL rank (one process x CUDA device) printed."""

    node: str
    pid: str | None = None
    device: int | None = None
    label: str | None = None
    rank: int | None = None
    nranks: int | None = None
    nodes: int | None = None  # the most nodes of a communicator this rank joined (nNodes)
    version: str | None = None
    network: str | None = None
    net_devices: list[str] = field(default_factory=list)
    merged_devices: list[str] = field(default_factory=list)  # "mlx5_2:1/RoCE+mlx5_3:1/RoCE"
    interfaces: list[str] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    ofi_provider: str | None = None
    no_ib_device: bool = False
    gdr_enabled_hcas: list[str] = field(default_factory=list)
    gdr_disabled_hcas: list[str] = field(default_factory=list)
    net_channels: int = 0
    ib_channels: int = 0
    gdr_channels: int = 0
    collnet_channels: int = 0  # "CollNet 00/0 : ... via COLLNET/SHARP/1/GDRDMA"
    socket_selected: bool = False  # a "NET/Socket : Using" line (see finish() for 2.4)
    undetermined: str | None = None  # why the network cannot be told from this log
    transports: list[str] = field(default_factory=list)
    # The failure NCCL propagated on this rank: its ncclResult_t, the frame it reached and
    # the first WARN printed before it (the root line), with their line numbers.
    error_code: int | None = None
    error_frame: str | None = None
    root: str | None = None
    root_line: int | None = None
    gave_up: bool = False  # the failure reached init/group/enqueue or the proxy thread
    last_warn: tuple[str, int] | None = None
    channels: int | None = None
    trees: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        dev = "-" if self.device is None else str(self.device)
        return f"{self.node}:{self.pid or '-'}[{dev}]"

    @property
    def gdr(self) -> bool | None:
        """True when GPUDirect RDMA was used, False when the log shows it off, else None."""
        if self.gdr_channels:
            return True
        if self.ib_channels or self.gdr_disabled_hcas:
            return False
        if self.gdr_enabled_hcas:
            return True
        return None

    @property
    def one_node(self) -> bool:
        """NCCL said every communicator of this rank has one node (``nNodes 1``): the
        network carries none of its traffic. ``nranks 1`` alone is not taken as proof
        (a log cut before the nNodes line, older releases)."""
        return self.nodes == 1

    @property
    def uses_socket(self) -> bool:
        return (self.network or "").lower() == "socket" or any(
            t.startswith("NET/Socket") for t in self.transports
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(key=self.key, gdr=self.gdr, uses_socket=self.uses_socket)
        return data


@dataclass
class LogReport:
    ranks: list[RankInfo]
    problems: list[Problem]
    version: str | None = None

    def failed(self) -> bool:
        return any(p.severity == "error" for p in self.problems)

    def verdict(self) -> str:
        """FAIL on an error; UNKNOWN when the log cannot answer what was asked (no network
        line to tell GPUDirect RDMA from); else OK. A log that cannot tell is not a pass."""
        if self.failed():
            return "FAIL"
        if any(p.severity == "unknown" for p in self.problems):
            return "UNKNOWN"
        return "OK"

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "ok": self.verdict() == "OK",
            "verdict": self.verdict(),
            "ranks": [r.to_dict() for r in self.ranks],
            "problems": [p.to_dict() for p in self.problems],
        }


_HOST_BREAKS = frozenset(":[]")


def _split_prefix(before: str) -> tuple[str, str | None, str | None]:
    """(label text, host, pid) from what precedes ``[dev]``: NCCL's ``host:pid:tid `` is
    the last word when present, and anything before it is a launcher label or a time.
    Linear in the prefix: string scans, no backtracking regex."""
    if not before[-1:].isspace():
        return before, None, None
    word_end = len(before.rstrip())
    head, _, tid = before[:word_end].rpartition(":")
    head, _, pid = head.rpartition(":")
    if not (tid.isdecimal() and pid.isdecimal()):
        return _bare_host(before)
    start = len(head)
    while start and not (head[start - 1].isspace() or head[start - 1] in _HOST_BREAKS):
        start -= 1
    if start == len(head):
        return before, None, None
    return before[:start], head[start:], pid


# A host name alone before "[dev]": NCCL builds with a log prefix of "host" only, or a
# collector that kept the host and dropped pid:tid ("gpu-server320 [5] NCCL WARN ...",
# NVIDIA/nccl#1920). It starts with a letter, so timestamps and "0:" labels are not hosts.
_BARE_HOST = re.compile(r"(?:^|(?<=\s))(?P<host>[A-Za-z][A-Za-z0-9._-]{0,252}[A-Za-z0-9])\s+$")


def _bare_host(before: str) -> tuple[str, str | None, str | None]:
    found = _BARE_HOST.search(before[-300:])
    if found is None or (found.start() == 0 and len(before) > 300):
        return before, None, None
    start = len(before) - len(before[-300:]) + found.start()
    return before[:start], found.group("host"), None


def _label(pre: str) -> str | None:
    for pattern in (_TAGGED, _SRUN_LABEL, _RANK_LABEL):
        match = pattern.search(pre)
        if match:
            return match.group("rank")
    return None


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.ranks: dict[tuple[str, str, int], RankInfo] = {}
        self.problems: list[Problem] = []
        self.version: str | None = None
        self.env: dict[str, str] = {}
        self.lineno = 0
        self.job_hosts: dict[int, set[str]] = {}  # nccl-tests' "# Rank N ... on HOST" lines
        self.init_all: set[tuple[str, str]] = set()  # processes that called ncclCommInitAll

    def rank(self, host: str | None, pid: str | None, dev: int, label: str | None) -> RankInfo:
        node = host or (f"{self.source}#{label}" if label else self.source)
        key = (node, pid or "", dev)
        info = self.ranks.get(key)
        if info is None:
            info = self.ranks[key] = RankInfo(node=node, pid=pid, device=dev, label=label)
        return info

    def feed(self, line: str) -> None:
        line = line.rstrip("\r\n")
        self.lineno += 1
        match = _MARK.search(line) if "NCCL " in line else None
        if match is None:
            self.loose(line)
            return
        pre, host, pid = _split_prefix(line[:match.start()])
        info = self.rank(host, pid, int(match.group("dev")), _label(pre))
        msg = line[match.end():].strip()
        if match.group("level") in ("WARN", "ERROR", "ABORT"):
            self.warn(info, msg, match.group("src") or "")
        else:
            self.info(info, msg)

    def loose(self, line: str) -> None:
        """Lines outside NCCL's prefix format: the bare version line, PyTorch's watchdog."""
        version = _VERSION.search(line)
        if version and "NCCL INFO" not in line:
            self.version = self.version or version.group("v")
        elif "Rank" in line and (rank := _TESTS_RANK.search(line)):
            self.job_hosts.setdefault(int(rank.group("rank")), set()).add(rank.group("host"))
        elif "Watchdog caught collective operation timeout" in line:
            self.problems.append(timeout_problem(line.strip()[:200]))
        elif "ignal" in line and (crashed := crash(line)):
            self.problems.append(crashed)

    def info(self, r: RankInfo, msg: str) -> None:
        if m := _CHAIN.match(msg):
            self.chain(r, m.group("src"), int(m.group("code")), m.group("tail") or "")
        elif m := _VERSION.match(msg):
            r.version = m.group("v")
        elif m := re.match(r"Using (?:internal )?[Nn]etwork (.+)$", msg):
            r.network = m.group(1).strip()  # "Using internal Network IB" up to NCCL 2.3
        elif m := re.match(r"NET/IB ?: Using ", msg):
            devices = msg[m.end():]
            if oob := _OOB.search(devices):  # "[0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>"
                devices = devices[:oob.start()]
                _add(r.interfaces, oob.group(1))
            r.net_devices, merged = [], []
            for item in _IB_DEVICE.finditer(devices):
                members = ([item.group("dev")] if item.group("dev") else
                           _MERGED_MEMBER.findall(item.group("merged")))
                r.net_devices.extend(members)
                if len(members) > 1:
                    merged.append("+".join(members))
            for name in merged:
                _add(r.merged_devices, name)
        elif (m := _VIRTUAL.match(msg)) and int(m.group("n")) > 1:
            _add(r.merged_devices, m.group("name"))
        elif msg.startswith("NET/IB : No device found") or msg.startswith("NET/IB: No device"):
            r.no_ib_device = True
        elif m := re.match(r"NET/Socket ?: Using (.*)$", msg):
            # From 2.5 on printed only when the socket transport is initialised as the
            # network; 2.4 also prints it for its bootstrap, before choosing (finish()).
            r.socket_selected = True
            for item in _LIST_ITEM.findall(m.group(1)):
                _add(r.interfaces, item)
        elif m := re.match(r"Bootstrap ?: Using (.*)$", msg):
            for item in _LIST_ITEM.findall(m.group(1)) or m.group(1).split():
                _add(r.bootstrap, item)
        elif m := re.match(r"NET/OFI Selected Provider is (\S+)", msg):
            r.ofi_provider = m.group(1)
        elif m := _GDR_LINE.search(msg):
            name = m.group("name") or f"HCA {m.group('hca')}"
            if m.group("state") == "Enabled":
                _add(r.gdr_enabled_hcas, name)
            else:  # keep NCCL's reason, e.g. "(no module)"
                _add(r.gdr_disabled_hcas, name + m.group("rest").rstrip())
        elif re.match(r"CollNet \d+/\d+ : .* via COLLNET/", msg):
            r.collnet_channels += 1
        elif m := re.match(r"(?:Channel|Ring) \d+(?:/\d+)? : .* via (.+?)\s*$", msg):
            self.transport(r, m.group(1))
        elif (m := re.match(r"Channel \d+/([0-9]{1,9}) :[\s\d]+$", msg)) or (
            m := re.match(r"([0-9]{1,9}) coll channels", msg)
        ):
            r.channels = max(r.channels or 0, int(m.group(1)))
        elif msg.startswith("Trees ") or msg.startswith("Connected all trees"):
            r.trees = True
        elif m := _COMM.search(msg):
            if msg.startswith("ncclCommInitAll "):  # one process created every rank
                self.init_all.add((r.node, r.pid or ""))
            # the largest communicator this rank joined names it (a process may also hold
            # small ones: a tensor-parallel group, a 1-rank comm)
            if int(m.group(2)) >= (r.nranks or 0):
                r.rank, r.nranks = int(m.group(1)), int(m.group(2))
        elif m := _NODES.search(msg):
            r.nranks = r.nranks or int(m.group(1))
            r.nodes = max(r.nodes or 0, int(m.group(2)))
        elif m := re.match(r"(NCCL_\w+) set by environment to (\S+?)\.?$", msg):
            self.env[m.group(1)] = m.group(2)

    def transport(self, r: RankInfo, via: str) -> None:
        _add(r.transports, via)
        net = _NET_VIA.match(via)
        if net is None:
            return
        r.net_channels += 1
        if net.group("net").upper().startswith("IB"):  # IB, IBext, IBext_v8 (SHARP plugin)
            r.ib_channels += 1
        if net.group("gdr"):
            r.gdr_channels += 1
        if r.network is None:  # old logs print no "Using network" line
            r.network = net.group("net")

    def chain(self, r: RankInfo, src: str, code: int, tail: str) -> None:
        """One ``file.cc:LINE -> N`` step. The root of a failure is the WARN just before its
        first step (else that step); the communicator is lost once a chain reaches a
        top-level frame or the proxy's progress thread."""
        if code not in NCCL_RESULT:
            return
        if r.error_code is None:
            r.error_code, r.error_frame = code, src
            if r.root is None:
                r.root, r.root_line = r.last_warn or (f"{src} -> {code}", self.lineno)
        top = src.rsplit("/", 1)[-1].split(":", 1)[0] in _TOP_FRAMES
        if (top or any(tag in tail for tag in _PROXY_THREAD_TAGS)) and not r.gave_up:
            r.gave_up, r.error_frame = True, src

    def warn(self, r: RankInfo, msg: str, src: str) -> None:
        line = (f"{src} {msg}".strip(), self.lineno)
        if any(text in msg for text in _FATAL_WARNS) and not r.gave_up:
            code = re.search(r"(?:retcode|res=)\s?([0-9]{1,3})", msg)
            value = int(code.group(1)) if code else 3
            r.gave_up = True
            if r.error_code is None:
                r.error_code = value if value in NCCL_RESULT else 3
                r.error_frame = src or "proxy"
                r.root, r.root_line = r.last_warn or line
        r.last_warn = line
        r.warnings.append(msg)
        where = f"{r.key} {src}".strip()
        self.problems.append(classify_warning(msg, where))

    def finish(self) -> LogReport:
        ranks = list(self.ranks.values())
        # Facts printed once per process (network, devices, version) hold for its threads.
        by_process: dict[tuple[str, str], list[RankInfo]] = {}
        for r in ranks:
            by_process.setdefault((r.node, r.pid or ""), []).append(r)
        for process, group in by_process.items():
            if process in self.init_all:  # all ranks in one process: one host
                for r in group:
                    r.nodes = r.nodes or 1
            for attr in ("version", "network", "ofi_provider"):
                value = next((getattr(r, attr) for r in group if getattr(r, attr)), None)
                for r in group:
                    if getattr(r, attr) is None:
                        setattr(r, attr, value)
            devices = next((r.net_devices for r in group if r.net_devices), [])
            merged = next((r.merged_devices for r in group if r.merged_devices), [])
            socket = any(r.socket_selected for r in group)
            no_ib = any(g.no_ib_device for g in group)
            version = next((r.version for r in group if r.version), None) or self.version
            for r in group:
                r.net_devices = r.net_devices or list(devices)
                r.merged_devices = r.merged_devices or list(merged)
                r.no_ib_device = r.no_ib_device or no_ib
                if r.network is None and r.ofi_provider:
                    r.network = f"OFI/{r.ofi_provider}"  # 2.4: only "NET/OFI Selected Provider"
                elif r.network is None and devices:
                    r.network = "IB"  # "NET/IB : Using [0]mlx5_0:1/IB": IB was initialised
                elif r.network is None and socket:
                    if _before_2_5(version) and not no_ib:
                        # NCCL 2.4 prints its bootstrap interface as "NET/Socket : Using"
                        # before it picks the network; this log ends before that choice.
                        r.undetermined = (f"NCCL {version}: only the bootstrap's NET/Socket "
                                          "line; the log ends before the network choice")
                    else:
                        r.network = "Socket"
        for r in ranks:
            r.version = r.version or self.version
        return LogReport(ranks=ranks, problems=self.problems, version=self.version)


def _before_2_5(version: str | None) -> bool:
    if not version:
        return False
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (2, 5)


def _add(items: list[str], value: str) -> None:
    if value not in items:
        items.append(value)


def parse_log(text: str | Iterable[str], source: str = "log", expect_gdr: bool = False,
              allow_socket: bool = False) -> LogReport:
    """Parse one log (its text, or its lines as they are read: constant memory) and derive
    the problems that need no single warning line."""
    parser = _Parser(source)
    for line in (text.splitlines() if isinstance(text, str) else text):
        parser.feed(line)
    report = parser.finish()
    add_derived_problems(report, parser.env, expect_gdr=expect_gdr, allow_socket=allow_socket,
                         job_hosts=parser.job_hosts)
    return report


def merge(reports: list[LogReport]) -> LogReport:
    """Several files (one per rank or node) as one report."""
    ranks = [r for rep in reports for r in rep.ranks]
    problems = [p for rep in reports for p in rep.problems]
    if any(r.gdr is not None or r.uses_socket for r in ranks):
        # one file per rank: a file that stops before the network choice is not "cannot
        # tell" when another rank's file shows what the job used
        problems = [p for p in problems if p.kind != "gdr_unknown"]
    version = next((rep.version for rep in reports if rep.version), None)
    return LogReport(ranks=ranks, problems=problems, version=version)


def comm_failure(ranks: list[RankInfo]) -> Problem | None:
    """One error for a communicator NCCL gave up on, naming the rank that failed first (the
    earliest root line) and that line; the other ranks usually fail because of it."""
    if not any(r.gave_up for r in ranks):
        return None
    failed = [r for r in ranks if r.error_code is not None]
    first = min(failed, key=lambda r: (r.root_line or 0))
    code = first.error_code or 3
    who = f"rank {first.rank} " if first.rank is not None else ""
    others = len(failed) - 1
    more = f"; {others} more rank(s) show errors after it" if others else ""
    bootstrap = "bootstrap.cc" in (first.error_frame or "")
    remedy = {
        1: "a CUDA call failed on that GPU: check it (nvidia-smi, Xid in the kernel log)",
        2: "a system call failed on that node: for ibv_create_cq/ibv_create_qp/ibv_reg_mr "
           "'Cannot allocate memory' raise the locked-memory limit (ulimit -l unlimited, "
           "Slurm PropagateResourceLimits) and check the RDMA device's resources; for "
           "sockets check the interfaces and firewalls",
        6: "a peer went away first: read the log of the rank it names for the first error",
    }.get(code, "read the root line: it names the call that failed")
    if bootstrap:
        remedy = ("the bootstrap (NCCL's TCP ring between ranks, before init) failed: check "
                  "that the nodes reach each other on NCCL_SOCKET_IFNAME's interface (routes, "
                  "firewall, ports), that no rank died first, and NCCL_SOCKET_IFNAME itself")
    stage = " during bootstrap" if bootstrap else ""
    return Problem(
        "error", "comm_failed",
        f"communicator failed{stage}: first on {who}{first.node} ({first.key}) with "
        f"{NCCL_RESULT.get(code, code)} at {first.error_frame}; root: {first.root}{more}",
        remedy, first.key,
    )


def single_host(ranks: list[RankInfo], job_hosts: dict[int, set[str]] | None = None) -> bool:
    """Every rank of the job is on one host and none sent over the network: a single-node
    job (nccl-tests ``-g 8`` in one process, torchrun on one node). Releases before 2.12
    print no ``nNodes`` line, so this is read from the ranks NCCL numbered (``comm 0x...
    rank R nranks N``: N ranks, all seen, one host) or from nccl-tests' device table (every
    rank of the job and its host, printed by rank 0)."""
    if any(r.net_channels for r in ranks):
        return False
    if job_hosts:  # nccl-tests' table: ranks 0..N-1 (an excerpt may hold only some)
        hosts = set().union(*job_hosts.values())
        sizes = {r.nranks for r in ranks if r.nranks}
        return (len(hosts) == 1 and sorted(job_hosts) == list(range(len(job_hosts)))
                and {r.node for r in ranks if r.pid} <= hosts
                and (not sizes or max(sizes) == len(job_hosts)))
    sizes = {r.nranks for r in ranks}
    if len({r.node for r in ranks}) != 1 or len(sizes) != 1 or None in sizes:
        return False
    seen = {r.rank for r in ranks if r.rank is not None}
    return len(seen) == sizes.pop()


def add_derived_problems(report: LogReport, env: dict[str, str], expect_gdr: bool,
                         allow_socket: bool,
                         job_hosts: dict[int, set[str]] | None = None) -> None:
    if single_host(report.ranks, job_hosts):
        for r in report.ranks:
            r.nodes = r.nodes or 1
    failure = comm_failure(report.ranks)
    if failure is not None:
        report.problems.insert(0, failure)
    if env.get("NCCL_COLLNET_ENABLE") == "1" and report.ranks and not any(
            r.collnet_channels for r in report.ranks):
        report.problems.append(Problem(
            "warning", "collnet_unused", "NCCL_COLLNET_ENABLE=1 but no rank set up a CollNet "
            "channel", "CollNet needs the SHARP plugin (Using network IBext) and a SHARP "
            "aggregation manager on the fabric; check 'sharp_hello' and the plugin's log lines",
        ))
    forced = env.get("NCCL_NET", "").lower() == "socket" or env.get("NCCL_IB_DISABLE") == "1"
    for r in report.ranks:
        if r.uses_socket and not allow_socket:
            why = "NET/IB found no device" if r.no_ib_device else "NCCL chose sockets"
            if forced:
                why = "sockets were forced (NCCL_NET=Socket or NCCL_IB_DISABLE=1)"
            if r.one_node:  # nothing crossed the network; a multi-node run would use it
                why += " (nNodes 1: no traffic crossed the network in this run)"
            report.problems.append(Problem(
                "warning" if r.one_node else "error", "socket_fallback",
                f"{r.key} uses NET/Socket: {why}",
                "make the RDMA NICs visible to NCCL (NCCL_IB_HCA must match "
                "/sys/class/infiniband names, rdma-core and /dev/infiniband in the container); "
                "set NCCL_NET=IB so a missing device fails instead of falling back",
                r.key,
            ))
        elif r.network and r.network.upper().startswith("IB") and r.gdr is False \
                and not r.one_node:
            detail = ", ".join(r.gdr_disabled_hcas) or "IB channels without /GDRDMA"
            report.problems.append(Problem(
                "error" if expect_gdr else "warning", "gdr_off",
                f"{r.key} uses NET/IB without GPUDirect RDMA ({detail})",
                "load nvidia_peermem (or use DMA-BUF with the open kernel modules), disable "
                "PCIe ACS on bare metal, check NCCL_NET_GDR_LEVEL against the GPU-NIC distance",
                r.key,
            ))
        elif r.undetermined:
            report.problems.append(Problem(
                "warning", "network_unknown", f"{r.key}: network not known ({r.undetermined})",
                "rerun with NCCL_DEBUG=INFO until the first collective, or read the rank's full "
                "log", r.key,
            ))
        elif r.no_ib_device and not r.uses_socket and r.network is None:
            report.problems.append(Problem(
                "warning", "no_ib_device", f"{r.key}: NET/IB : No device found",
                "NCCL found no RDMA NIC; unless another plugin carries the traffic it falls "
                "back to sockets", r.key,
            ))
    if expect_gdr and report.ranks and all(r.one_node for r in report.ranks):
        report.problems.append(Problem(
            "warning", "gdr_not_used",
            "GPUDirect RDMA expected, but every communicator in the log has one node: no "
            "traffic crossed the network, so GPUDirect RDMA was not exercised",
            "check GPUDirect RDMA on a run across two or more nodes",
        ))
    elif expect_gdr and report.ranks and all(
            r.gdr is None and not r.uses_socket for r in report.ranks if not r.one_node):
        # No rank printed a channel over the network nor a GPU Direct RDMA line: the log
        # ends before NCCL chose (an OFI log ending in "provider efa output empty list").
        nets = sorted({r.network for r in report.ranks if r.network}) or ["none"]
        report.problems.append(Problem(
            "unknown", "gdr_unknown",
            f"GPUDirect RDMA expected but the log cannot tell: no rank printed a network "
            f"channel or a GPU Direct RDMA line (network: {', '.join(nets)})",
            "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET past the first collective "
            "and pass every rank's output; a log that stops at init is not a pass",
        ))
