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
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

# Launcher tags. Open MPI's --tag-output "[jobid,rank]<stdout>:" can sit anywhere: after
# indentation, a quote, a log collector's timestamp, or another rank's unfinished line, so
# it is removed wherever it appears. The others are leading labels, peeled off in turn:
# srun --label "N: " (right-aligned), MPICH/Intel MPI -prepend-rank "[N] ", pdsh "host: ".
_OMPI_TAG = re.compile(r"\[\d{1,9},\d{1,9}\]<std(?:out|err)>:")
# A rank tag inside a result row: a launcher that labels every chunk it forwards, not every
# line, puts "[0]" before each printf of a row (nccl-tests prints a row in pieces: the
# size/count/type/redop/root preamble, then each out-of-place and in-place body; util.cu).
_MID_TAG = re.compile(r"\[\d{1,9}(?:,\d{1,9})?\](?:<std(?:out|err)>:)?")
_LEAD_LABEL = re.compile(
    r"^\s*(?:\d{1,9}:(?:\s+|$)|\[\d{1,9}\]\s*|[A-Za-z][\w.-]{0,253}:\s+)"
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
# The test binary's own failure lines (src/common.h of NVIDIA/nccl-tests: "%s: Test NCCL
# failure %s:%d '%s / %s'" with the host first, then " .. %s pid %d: Test failure %s:%d"),
# and NCCL 1.x tests' "NCCL failure all_reduce.cu:95 'unhandled cuda error'".
_FAILURE = re.compile(r"(?:^|\s)(?:Test (?:NCCL|CUDA) failure|NCCL failure) \S{1,200} '")

# Messages below this are latency-bound; nccl-tests maintainers note 256 MiB is still too
# small to reach peak bus bandwidth (NVIDIA/nccl-tests#212).
PEAK_MIN_BYTES = 1 << 30
# Rows and device lines kept per run for display and --json; every row is still judged
# (#wrong, the largest size) as it streams by, so a 200 MB output needs bounded memory
# (nccl-tests -N 0 repeats its sweep until killed; a sweep is about 30 rows).
ROWS_KEPT = 4096
DEVICES_KEPT = 16384


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
    rows: list[Row] = field(default_factory=list)  # the first ROWS_KEPT of the output
    out_of_bounds: int | None = None
    avg_busbw: float | None = None
    nccl_version: str | None = None
    tests_version: str | None = None
    # Over every row, kept or not: how many, #wrong summed, rows with #wrong > 0 and the
    # first size that had some, the largest-size row.
    rows_total: int = 0
    wrong_sum: int = 0
    wrong_rows: int = 0
    first_wrong_size: int | None = None
    largest: Row | None = None
    source: str = "text"  # "text" or "json" (nccl-tests -J)
    errors: list[str] = field(default_factory=list)  # the test's failure lines, as printed

    def add(self, row: Row, keep: bool = True) -> None:
        self.rows_total += 1
        if keep:
            self.rows.append(row)
        if row.wrong:
            self.wrong_sum += row.wrong
            self.wrong_rows += 1
            if self.first_wrong_size is None:
                self.first_wrong_size = row.size
        if self.largest is None or row.size > self.largest.size:
            self.largest = row

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(d.host for d in self.devices))

    @property
    def wrong_total(self) -> int:
        return self.wrong_sum

    @property
    def data_errors(self) -> bool:
        return self.wrong_total > 0 or bool(self.out_of_bounds)

    def large_message_row(self) -> Row | None:
        """The row with the largest message size: where bus bandwidth peaks."""
        return self.largest

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


@dataclass(frozen=True)
class _Layout:
    """Where the cells of a row are: the leading columns (size, count, type, redop, root),
    the width of each half (4 columns, 8 with -I's per-iteration columns i_min, i_max,
    i_p99, i_cv% since nccl-tests 2.19.2) and whether the 4th cell is the old "error"."""

    lead: tuple[str, ...]
    width: int = 4
    old: bool = False


def _layout(tokens: list[str]) -> _Layout:
    """From the header line (``size count type redop root time algbw busbw #wrong ...``)."""
    times = [i for i, tok in enumerate(tokens) if tok in ("time", "cputime")]
    lead = tuple(tokens[:times[0]]) if times else tuple(tokens)
    width = times[1] - times[0] if len(times) > 1 else 4
    old = "error" in tokens and "#wrong" not in tokens
    return _Layout(lead, width if 4 <= width <= 16 else 4, old)


def _guess_layout(tokens: list[str]) -> _Layout | None:
    """No header seen (an excerpt): infer the leading columns from the row itself."""
    n = len(tokens) - 8
    lead: tuple[str, ...]
    if n == 5:
        lead = ("size", "count", "type", "redop", "root")
    elif n == 4:
        numeric = re.fullmatch(r"-?\d+", tokens[3]) is not None
        lead = ("size", "count", "type", "root") if numeric else ("size", "count", "type", "redop")
    elif n == 3:  # releases before 2.0 (all_gather, broadcast): no redop, no root
        lead = ("size", "count", "type")
    else:
        return None
    # the old "error" column is a deviation printed "%.0e" ("0e+00", "2e-03"); a #wrong
    # count prints "0" or "1e+06" ("%g" of a whole number)
    last = tokens[n + 3]
    old = "e" in last and last != "N/A" and _small(last)
    return _Layout(lead, 4, old)


def _small(text: str) -> bool:
    try:
        return float(text) < 1
    except ValueError:
        return False


def _row(tokens: list[str], layout: _Layout | None) -> Row | None:
    """One result row, or None for a line that only looks like one (noise between rows,
    a garbled cell): nccl-tests prints plain decimal numbers, "N/A" for no check."""
    if layout is None or not layout.lead:
        return None
    n = len(layout.lead)
    if len(tokens) < n + 2 * layout.width or (layout.width == 4 and len(tokens) > n + 8 + 2):
        return None  # (a -T timestamp adds two tokens after the in-place half)
    try:
        return _cells(tokens, layout)
    except ValueError:
        return None


def _cells(tokens: list[str], layout: _Layout) -> Row | None:
    if not all(_DECIMAL.fullmatch(t) for t in tokens[:2]):
        return None
    n, old = len(layout.lead), layout.old
    values = dict(zip(layout.lead, tokens))
    cells = []
    for at in (n, n + layout.width):
        time_us, algbw, busbw, last = tokens[at:at + 4]
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


def parse(text: str | Iterable[str]) -> list[TestRun]:
    """All test runs in one output (a file may hold several collectives): its text, or its
    lines as they are read (bounded memory, see ROWS_KEPT). Text that starts with ``{`` is
    nccl-tests' own JSON (``-J file.json``)."""
    if isinstance(text, str):
        if text.lstrip()[:1] == "{":
            return parse_json(text)
        text = text.splitlines()
    return list(iter_runs(text))


def iter_runs(lines: Iterable[str]) -> Iterator[TestRun]:
    """Each test run as soon as it ends; rows beyond ROWS_KEPT are judged but not kept."""
    run = TestRun()
    layout: _Layout | None = None

    def done() -> bool:
        return bool(run.rows_total or run.devices or run.out_of_bounds is not None
                    or run.errors)

    for raw in lines:
        line = strip_launcher(raw.rstrip())
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[0].isdigit():
            tokens = (_MID_TAG.sub(" ", stripped) if "[" in stripped else stripped).split()
            row = _row(tokens, layout or _guess_layout(tokens))
            if row is not None:
                run.add(row, keep=len(run.rows) < ROWS_KEPT)
                continue
        if m := _COLLECTIVE.match(stripped):
            if "starting" in stripped and (run.rows_total or run.devices):
                yield run
                run = TestRun()
            run.collective = run.collective or m.group("name")
            if "concluded" in stripped:
                if done():
                    yield run
                run = TestRun()
        elif m := _TESTS_VERSION.match(stripped):
            run.tests_version = m.group("v")
        elif (m := _NTHREAD.match(stripped)) and "minBytes" in stripped:
            if run.rows_total:
                yield run
                run = TestRun()
            run.header = _header_fields("nThread " + m.group("body"))
        elif m := _RANK.match(stripped):
            if len(run.devices) < DEVICES_KEPT:
                run.devices.append(Device(
                    rank=int(m.group("rank")), host=m.group("host"), pid=int(m.group("pid")),
                    device=int(m.group("dev")), bus=m.group("bus"), name=m.group("name"),
                ))
        elif stripped.startswith("#") and " size " in f" {stripped[1:]} " and "busbw" in stripped:
            layout = _layout(stripped.lstrip("#").split())
        elif m := _OOB.match(stripped):
            run.out_of_bounds = int(m.group("n"))
        elif m := _AVG.match(stripped):
            with contextlib.suppress(ValueError):  # a garbled summary line is not a figure
                run.avg_busbw = _measured(m.group("bw"))
        elif (m := _VERSION.search(stripped)) and not stripped.startswith("#"):
            run.nccl_version = run.nccl_version or m.group("v")
        elif "failure" in stripped and len(run.errors) < 100 and _FAILURE.search(stripped):
            run.errors.append(" ".join(raw.split())[:300])  # raw: its host label names it
    if done():
        yield run


def parse_json(text: str, path: str = "nccl-tests JSON") -> list[TestRun]:
    """nccl-tests' ``-J FILE.json`` output (src/util.cu of NVIDIA/nccl-tests, JSON file
    version 3, since nccl-tests 2.17.3): one object with ``config`` (``devices``),
    ``results`` (``size``, ``count``, ``type``, ``redop``, ``root``, ``out_of_place`` and
    ``in_place`` each ``time``/``cpu_time``, ``alg_bw``, ``bus_bw``, ``nwrong`` or null),
    ``out_of_bounds`` and ``average_bus_bandwidth``. A wrong shape is a UsageError naming
    the file and the key."""
    import json

    try:
        return [_json_run(json.loads(text))]
    except RecursionError:
        raise _not_json(path, ValueError("nested too deeply")) from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _not_json(path, exc) from None


def _not_json(path: str, error: BaseException) -> Exception:
    from slurmfabric._common.textcheck import one_line
    from slurmfabric.errors import UsageError

    detail = one_line(f"{type(error).__name__}: {error}", 160)
    return UsageError(f"nccl-tests JSON {path}: not the -J output of nccl-tests ({detail})",
                      hint="pass the file nccl-tests wrote with -J FILE.json (an object with "
                      "'results'), or its text output")


def _json_run(data: dict) -> TestRun:
    if not isinstance(data, dict) or not isinstance(data["results"], list):
        raise TypeError("'results' is not a list")
    run = TestRun(source="json")
    version = data.get("nccl_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > 0:
        # NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9
        run.nccl_version = f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    config = data.get("config") or {}
    for dev in (config.get("devices") or [])[:DEVICES_KEPT]:
        run.devices.append(Device(
            rank=_int(dev["rank"]), host=str(dev["hostname"]), pid=_int(dev["pid"]),
            device=_int(dev["device"]), bus=str(dev.get("device_hex", "")),
            name=str(dev.get("device_info", "")).strip()))
    for item in data["results"]:
        row = _json_row(item)
        if row is not None:
            run.add(row, keep=len(run.rows) < ROWS_KEPT)
    oob = data.get("out_of_bounds")
    if isinstance(oob, dict):
        run.out_of_bounds = _int(oob.get("count", 0))
    avg = data.get("average_bus_bandwidth")
    if isinstance(avg, dict) and avg.get("bandwidth") is not None:
        run.avg_busbw = _json_number(avg["bandwidth"])
    return run


def _json_row(item: dict) -> Row | None:
    """One result; None when a figure is "nan" (not a measurement, as a text row with nan
    is not read)."""
    if not isinstance(item, dict):
        raise TypeError(f"a result is {type(item).__name__}, not an object")
    try:
        halves = [_json_cell(item.get("out_of_place")), _json_cell(item.get("in_place"))]
    except ValueError:
        if "nan" in _json_figures(item):
            return None
        raise
    if halves[1] is None:
        raise ValueError("a result has no 'in_place' figures")
    root = str(item.get("root", "")).strip()
    redop = item.get("redop")
    return Row(size=_int(item["size"]), count=_int(item["count"]),
               type=str(item.get("type", "?")), redop=None if redop is None else str(redop),
               root=int(root) if re.fullmatch(r"-?[0-9]{1,9}", root) else None,
               out_of_place=halves[0] or halves[1], in_place=halves[1])


def _json_figures(item: dict) -> list[object]:
    return [value for half in ("out_of_place", "in_place")
            if isinstance(item.get(half), dict) for value in item[half].values()]


def _json_cell(half: object) -> Cell | None:
    if half is None:
        return None
    if not isinstance(half, dict):
        raise TypeError(f"a result half is {type(half).__name__}, not an object")
    time_us = half.get("time", half.get("cpu_time"))
    wrong = half.get("nwrong")
    return Cell(time_us=_json_number(time_us), algbw=_json_number(half["alg_bw"]),
                busbw=_json_number(half["bus_bw"]),
                wrong=None if wrong is None else int(_json_number(wrong)))


def _json_number(value: object) -> float:
    """A figure as nccl-tests writes it: a number, or "nan" (util.cu's jsonDouble)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"{value!r} is not a number")
    return _measured(str(value))


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


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
    # "OK", "FAIL", or "UNKNOWN": bandwidth was asked about and the output cannot answer
    # (the sweep stopped below the size where bus bandwidth saturates)
    state: str = "OK"

    def to_dict(self) -> dict:
        return asdict(self)


def judge(run: TestRun, rates_gbps: list[float] | None = None,
          expected_min: float | None = None, fabric: str = "ib") -> Verdict:
    """Data errors always fail; bandwidth fails only against an expectation, and a sweep
    that ends below PEAK_MIN_BYTES cannot tell (UNKNOWN, never OK) when one is given."""
    findings = []
    state = "OK"
    if run.wrong_total:
        state = "FAIL"
        findings.append(
            f"DATA ERRORS: #wrong > 0 at {run.wrong_rows} sizes (first {run.first_wrong_size} "
            "B): the fabric or a GPU corrupted data; drain the nodes involved and rerun per "
            "pair to isolate"
        )
    if run.out_of_bounds:
        state = "FAIL"
        findings.append(f"DATA ERRORS: Out of bounds values : {run.out_of_bounds}")
    if run.errors:
        state = "FAIL"
        findings.append(f"TEST FAILED: {run.errors[0]}" + (
            f" (and {len(run.errors) - 1} more failure lines)" if len(run.errors) > 1 else ""))
    if not run.rows_total:
        state = "FAIL"
        findings.append("no result rows: the test did not run to completion")
    busbw = run.large_message_busbw()
    expected = expected_busbw(rates_gbps, fabric) if rates_gbps else None
    low = expected_min if expected_min is not None else (expected[0] if expected else None)
    row = run.large_message_row()
    if row is not None and row.size < PEAK_MIN_BYTES and low is not None:
        if state == "OK":
            state = "UNKNOWN"
        findings.append(
            f"CANNOT TELL: the sweep ends at {row.size} B ({busbw:.2f} GB/s busbw); bus "
            f"bandwidth saturates only at >= {PEAK_MIN_BYTES} B (1 GiB), so {low:.1f} GB/s "
            "cannot be judged: rerun up to at least -e 1G (-e 8G is the usual sweep)"
        )
    elif row is not None and row.size < PEAK_MIN_BYTES:
        findings.append(
            f"largest message is {row.size} B (busbw {busbw:.2f} GB/s): bus bandwidth peaks "
            "only at >= 1 GiB, bandwidth not judged (run with -e 8G)"
        )
    elif busbw is not None and low is not None:
        if busbw < low:
            state = "FAIL"
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
    return Verdict(ok=state == "OK", findings=findings, busbw=busbw, expected=expected,
                   state=state)
