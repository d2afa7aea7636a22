"""Parse nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ...) and judge it.

The format comes from nccl-tests' ``src/common.cu``: a ``# nThread ...`` header, one
``#  Rank  N Group  G Pid P on HOST device D [BUS] NAME`` line per rank, two ``#`` lines
naming the columns, one row per message size with out-of-place and in-place
``time algbw busbw #wrong`` (``#wrong`` printed with ``%g``, so large counts read
``1.04858e+06``; ``N/A`` with ``-c 0``), then ``# Out of bounds values : N OK|FAILED`` and
``# Avg bus bandwidth    : X``. Older versions have no ``root`` column and an ``error``
column (a deviation, not a count); broadcast-style tests had no ``redop`` column. Launcher
tags are stripped wherever they stand (``strip_launcher``): ``[1,0]<stdout>:`` from Open MPI
--tag-output (also after indentation or a timestamp), ``0: `` from ``srun -l``, ``[0] ``
from -prepend-rank, ``host: `` from pdsh.

Expected bandwidth rule (documented in ``expected_busbw``): the large-message bus bandwidth
of an inter-node all_reduce approaches the node's summed NIC line rate. Standard library only.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import asdict, dataclass, field

# Launcher tags. Open MPI's --tag-output "[jobid,rank]<stdout>:" can sit anywhere: after
# indentation, a quote, a log collector's timestamp, or another rank's unfinished line, so
# it is removed wherever it appears. The others are leading labels, peeled off in turn:
# srun --label "N: " (right-aligned), MPICH/Intel MPI -prepend-rank "[N] ", pdsh "host: ".
_OMPI_TAG = re.compile(r"\[\d{1,9},\d{1,9}\]<std(?:out|err)>:")
_LEAD_LABEL = re.compile(
    r"^\s*(?:\d{1,9}:(?:\s+|$)|\[\d{1,9}\](?:\s+|$)|[A-Za-z][\w.-]{0,253}:\s+)"
)
_RANK = re.compile(
    r"^#\s+Rank\s+(?P<rank>[0-9]{1,9})(?:\s+Group\s+(?P<group>[0-9]{1,9}))?\s+Pid\s+(?P<pid>[0-9]{1,9})\s+on\s+"
    r"(?P<host>\S+)\s+device\s+(?P<dev>[0-9]{1,9})\s+\[(?P<bus>[^\]]+)\]\s+(?P<name>.+?)\s*$"
)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<n>[0-9]{1,20})\s*(?P<verdict>OK|FAILED)?")
_DECIMAL = re.compile(r"[0-9]{1,20}")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<bw>[\d.eE+-]+)")
_NTHREAD = re.compile(r"^#?\s*nThread (?P<body>.*)$")
_COLLECTIVE = re.compile(r"^#\s*Collective test (?:starting|concluded):\s*(?P<name>\S+)")
_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)")
_TESTS_VERSION = re.compile(r"^#\s*nccl-tests version (?P<v>\S+)")

# Messages below this are latency-bound; nccl-tests maintainers note 256 MiB is still too
# small to reach peak bus bandwidth (NVIDIA/nccl-tests#212).
PEAK_MIN_BYTES = 1 << 30


@dataclass
class Cell:
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None = None  # elements wrong; None when not checked (N/A) or old format
    error: float | None = None  # old nccl-tests: max deviation instead of a count


@dataclass
class Row:
    size: int
    count: int
    type: str
    redop: str | None
    root: int | None
    out_of_place: Cell
    in_place: Cell

    @property
    def busbw(self) -> float:
        return max(self.out_of_place.busbw, self.in_place.busbw)

    @property
    def wrong(self) -> int:
        return sum(c.wrong or 0 for c in (self.out_of_place, self.in_place))


@dataclass
class Device:
    rank: int
    host: str
    pid: int
    device: int
    bus: str
    name: str


@dataclass
class TestRun:
    collective: str | None = None
    header: dict[str, str] = field(default_factory=dict)
    devices: list[Device] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    out_of_bounds: int | None = None
    avg_busbw: float | None = None
    nccl_version: str | None = None
    tests_version: str | None = None

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(d.host for d in self.devices))

    @property
    def wrong_total(self) -> int:
        return sum(r.wrong for r in self.rows)

    @property
    def data_errors(self) -> bool:
        return self.wrong_total > 0 or bool(self.out_of_bounds)

    def large_message_row(self) -> Row | None:
        """The row with the largest message size: where bus bandwidth peaks."""
        return max(self.rows, key=lambda r: r.size) if self.rows else None

    def large_message_busbw(self) -> float | None:
        row = self.large_message_row()
        return None if row is None else row.busbw

    def to_dict(self) -> dict:
        data = asdict(self)
        row = self.large_message_row()
        data.update(
            hosts=self.hosts,
            wrong_total=self.wrong_total,
            data_errors=self.data_errors,
            large_message_bytes=None if row is None else row.size,
            large_message_busbw=self.large_message_busbw(),
        )
        return data


def _number(text: str) -> float | None:
    """A measured cell: a finite number >= 0, None for "N/A"; ValueError otherwise (NaN
    or inf in a row must not pass a bandwidth check by comparing false)."""
    if text == "N/A":
        return None
    value = float(text)
    if not (0.0 <= value < float("inf")):
        raise ValueError(f"not a measurement: {text!r}")
    return value


def _measured(text: str) -> float:
    value = _number(text)
    if value is None:
        raise ValueError("N/A where a time or bandwidth goes")
    return value


def _count(text: str) -> int | None:
    """The #wrong column: a count nccl-tests prints with %g ("5.36871e+08"), or N/A."""
    value = _number(text)
    return None if value is None else int(value)


def _columns(tokens: list[str]) -> list[str]:
    """Leading column names from the header line (before the first ``time``)."""
    lead = []
    for tok in tokens:
        if tok in ("time", "cputime"):
            break
        lead.append(tok)
    return lead


def _guess_lead(tokens: list[str]) -> list[str]:
    """No header seen (an excerpt): infer the leading columns from the row itself."""
    n = len(tokens) - 8
    if n == 5:
        return ["size", "count", "type", "redop", "root"]
    if n == 4:
        numeric = re.fullmatch(r"-?\d+", tokens[3]) is not None
        return ["size", "count", "type", "root"] if numeric else ["size", "count", "type", "redop"]
    return []


def _row(tokens: list[str], lead: list[str], old: bool) -> Row | None:
    """One result row, or None for a line that only looks like one (noise between rows,
    a garbled cell): nccl-tests prints plain decimal numbers, "N/A" for no check."""
    if not lead or len(tokens) != len(lead) + 8:
        return None
    try:
        return _cells(tokens, lead, old)
    except ValueError:
        return None


def _cells(tokens: list[str], lead: list[str], old: bool) -> Row | None:
    if not all(_DECIMAL.fullmatch(t) for t in tokens[:2]):
        return None
    values = dict(zip(lead, tokens))
    cells = []
    for half in (tokens[len(lead):len(lead) + 4], tokens[len(lead) + 4:]):
        time_us, algbw, busbw, last = half
        cells.append(Cell(
            time_us=_measured(time_us), algbw=_measured(algbw), busbw=_measured(busbw),
            # old releases print the largest error, which may be "nan" on corrupt data
            wrong=None if old else _count(last),
            error=(None if last == "N/A" else float(last)) if old else None,
        ))
    root = values.get("root")
    return Row(
        size=int(tokens[0]), count=int(tokens[1]), type=values.get("type", "?"),
        redop=values.get("redop"), root=None if root is None else int(root),
        out_of_place=cells[0], in_place=cells[1],
    )


def strip_launcher(line: str) -> str:
    """The line as nccl-tests printed it, without the launchers' rank or host tags."""
    if "<std" in line:  # what precedes the last tag is a collector's or launcher's prefix
        tags = list(_OMPI_TAG.finditer(line))
        if tags:
            line = line[tags[-1].end():]
    for _ in range(4):  # e.g. pdsh "host: " then srun "0: "; each pass removes one label
        match = _LEAD_LABEL.match(line)
        if match is None:
            break
        line = line[match.end():]
    return line


def parse(text: str) -> list[TestRun]:
    """All test runs in one output (a file may hold several collectives)."""
    runs: list[TestRun] = []
    run = TestRun()
    lead: list[str] = []
    old = False

    def flush() -> None:
        nonlocal run
        if run.rows or run.devices or run.out_of_bounds is not None:
            runs.append(run)
        run = TestRun()

    for raw in text.splitlines():
        line = strip_launcher(raw.rstrip())
        stripped = line.strip()
        if m := _COLLECTIVE.match(stripped):
            if "starting" in stripped and (run.rows or run.devices):
                flush()
            run.collective = run.collective or m.group("name")
            if "concluded" in stripped:
                flush()
        elif m := _TESTS_VERSION.match(stripped):
            run.tests_version = m.group("v")
        elif (m := _NTHREAD.match(stripped)) and "minBytes" in stripped:
            if run.rows:
                flush()
            run.header = _header_fields("nThread " + m.group("body"))
        elif m := _RANK.match(stripped):
            run.devices.append(Device(
                rank=int(m.group("rank")), host=m.group("host"), pid=int(m.group("pid")),
                device=int(m.group("dev")), bus=m.group("bus"), name=m.group("name"),
            ))
        elif stripped.startswith("#") and " size " in f" {stripped[1:]} " and "busbw" in stripped:
            tokens = stripped.lstrip("#").split()
            lead = _columns(tokens)
            old = "error" in tokens and "#wrong" not in tokens
        elif m := _OOB.match(stripped):
            run.out_of_bounds = int(m.group("n"))
        elif m := _AVG.match(stripped):
            with contextlib.suppress(ValueError):  # a garbled summary line is not a figure
                run.avg_busbw = _measured(m.group("bw"))
        elif (m := _VERSION.search(stripped)) and not stripped.startswith("#"):
            run.nccl_version = run.nccl_version or m.group("v")
        elif stripped and stripped[0].isdigit():
            tokens = stripped.split()
            row = _row(tokens, lead or _guess_lead(tokens), old)
            if row is not None:
                run.rows.append(row)
    flush()
    return runs


def _header_fields(body: str) -> dict[str, str]:
    """``nThread 1 nGpus 1 minBytes 8 ... step: 2(factor) warmup iters: 5`` as a dict."""
    fields: dict[str, str] = {}
    for m in re.finditer(r"([A-Za-z_]+(?: iters)?)\s*:?\s+(\S+)", body):
        fields[m.group(1)] = m.group(2)
    return fields


# -- what the fabric should give -----------------------------------------------------------

def nominal_gbytes(rates_gbps: list[float]) -> float:
    """Summed NIC line rate of one node in GB/s (Gb/s / 8)."""
    return sum(rates_gbps) / 8.0


def expected_busbw(rates_gbps: list[float], fabric: str = "ib") -> tuple[float, float]:
    """The large-message all_reduce bus bandwidth an inter-node run should reach, in GB/s,
    from the whatif model (slurmfabric/whatif/model.py, one owner of what a fabric gives): NCCL
    runs one ring per rail, so busbw is the rail count x one rail's effective rate (0.96 of
    the line rate on InfiniBand, less on RoCE), and published runs spread 10 % below that:
    8 x 400 Gb/s gives 346-384 GB/s. Runs on two nodes can exceed it (NCCL's tree keeps part
    of the traffic on NVLink); below the band means a slow NIC, cable, switch port or a
    socket fallback."""
    from slurmfabric.whatif import model as whatif

    high = whatif.nic_bound_busbw(rates_gbps, fabric)
    return high * (1 - whatif.BUSBW_TOLERANCE), high


def discover_rates(sysfs_root: str | None = None) -> tuple[list[float], list[str]]:
    """Rates (Gb/s) and names of the rails the plan chose on this node (plan/rails.py)."""
    rates, names, _ = discover_fabric(sysfs_root)
    return rates, names


def discover_fabric(sysfs_root: str | None = None,
                    topo: object = None) -> tuple[list[float], list[str], str]:
    """The rails' rates and names and the fabric they make ("ib" or "roce").

    Only rails carry NCCL's inter-node traffic: storage and frontend NICs, Down ports and
    VFs are left out, so a node with 8 rails and 2 storage NICs expects 8 ports' bandwidth.
    ``topo``: a Topology already loaded (a 'topo snapshot' of a compute node)."""
    from slurmfabric.plan.rails import choose_rails

    if topo is None:
        from slurmfabric.topology import discover

        topo = discover(sysfs_root, plan_only=True)
    choice = choose_rails(topo, None)  # type: ignore[arg-type]
    rails = [port for port in choice.rails if port.rate_gbps]
    fabric = "roce" if rails and all(p.link_layer == "Ethernet" for p in rails) else "ib"
    return [float(port.rate_gbps) for port in rails], [port.name for port in rails], fabric


@dataclass
class Verdict:
    ok: bool
    findings: list[str]
    busbw: float | None
    expected: tuple[float, float] | None

    def to_dict(self) -> dict:
        return asdict(self)


def judge(run: TestRun, rates_gbps: list[float] | None = None,
          expected_min: float | None = None, fabric: str = "ib") -> Verdict:
    """Data errors always fail; bandwidth fails only against an expectation."""
    findings = []
    ok = True
    if run.wrong_total:
        ok = False
        bad = [r.size for r in run.rows if r.wrong]
        findings.append(
            f"DATA ERRORS: #wrong > 0 at {len(bad)} sizes (first {bad[0]} B): the fabric or a "
            "GPU corrupted data; drain the nodes involved and rerun per pair to isolate"
        )
    if run.out_of_bounds:
        ok = False
        findings.append(f"DATA ERRORS: Out of bounds values : {run.out_of_bounds}")
    if not run.rows:
        ok = False
        findings.append("no result rows: the test did not run to completion")
    busbw = run.large_message_busbw()
    expected = expected_busbw(rates_gbps, fabric) if rates_gbps else None
    low = expected_min if expected_min is not None else (expected[0] if expected else None)
    row = run.large_message_row()
    if row is not None and row.size < PEAK_MIN_BYTES:
        findings.append(
            f"largest message is {row.size} B: bus bandwidth peaks only at >= 1 GiB, "
            "bandwidth not judged (run with -e 8G)"
        )
    elif busbw is not None and low is not None:
        if busbw < low:
            ok = False
            findings.append(
                f"LOW BANDWIDTH: {busbw:.2f} GB/s busbw at {row.size} B, expected >= {low:.1f}"
            )
        else:
            findings.append(f"bandwidth OK: {busbw:.2f} GB/s >= {low:.1f} GB/s")
    elif busbw is not None:  # said, so a collapsed fabric (5 GB/s on 400G NICs) is seen
        findings.append(
            f"busbw {busbw:.2f} GB/s at {row.size} B: not judged without an expectation "
            "(--rates, --ports, --discover or --expect-busbw)"
        )
    return Verdict(ok=ok, findings=findings, busbw=busbw, expected=expected)
