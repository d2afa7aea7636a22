"""Parse the output of the perftest bandwidth tools (``ib_write_bw``, ``ib_read_bw``,
``ib_send_bw``; https://github.com/linux-rdma/perftest).

The header block names the test (``RDMA_Write BW Test``), the device, the link type and, on
RoCE, the GID index; the result table's header gives the unit (``Gb/sec`` with
``--report_gbits``, else ``MB/sec``, ``MiB/sec`` since perftest 24.07) and each row is
``#bytes #iterations BW-peak BW-average MsgRate`` (tabs or spaces). CUDA runs
(``--use_cuda``) print "initializing CUDA" first. A run that could not connect or failed
mid-way prints one of the messages in ``FAILURES`` and fewer rows than asked. Recorded real
outputs are in tests/fixtures/perftest/ (SOURCES.md gives each one's source and perftest's
format strings). Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slurmfabric.errors import UsageError

# Messages of a run that did not measure what it should (perftest's own wording).
FAILURES = ("Couldn't connect to", "Unable to init the socket connection",
            "Failed to modify QP", "Unable to Connect the HCA's through the link",
            "Completion with error", "Failed to complete run_iter",
            "Couldn't listen to port")
_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>[A-Za-z/]{1,8})\]")
_ROW = re.compile(r"^\s*(?P<bytes>[0-9]{1,12})\s+(?P<iters>[0-9]{1,12})\s+"
                  r"(?P<peak>[0-9]{1,9}(?:\.[0-9]{1,9})?)\s+(?P<avg>[0-9]{1,9}(?:\.[0-9]{1,9})?)"
                  r"(?:\s+(?P<rate>[0-9]{1,9}(?:\.[0-9]{1,9})?))?\s*$")
_TEST = re.compile(r"^\s*(?P<name>[A-Za-z_]{1,20} (?:BW|Lat) Test)\s*$")
_FIELD = re.compile(r"(Device|Link type|GID index)\s*:\s*([^\s]{1,64})")
# Bytes per second of one unit, to Gb/s (10^9 bits) like nccl-tests' busbw.
_TO_GBPS = {"Gb/sec": 1.0, "MB/sec": 8e6 / 1e9, "MiB/sec": 8 * 1048576 / 1e9}
MAX_LINES = 100_000


@dataclass
class Row:
    size: int
    iterations: int
    peak: float
    average: float
    msg_rate: float | None


@dataclass
class PerftestRun:
    test: str = ""
    device: str = ""
    link_type: str = ""
    gid_index: str = ""
    cuda: bool = False
    unit: str = ""
    rows: list[Row] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def gbps(self, value: float) -> float:
        return value * _TO_GBPS[self.unit]

    @property
    def bandwidth_gbps(self) -> float | None:
        """The average bandwidth of the largest message size measured, in Gb/s."""
        if not self.rows:
            return None
        return self.gbps(max(self.rows, key=lambda r: r.size).average)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and not self.errors


def parse(text: str) -> PerftestRun:
    """One tool run (a client's or a server's output) -> its header facts and rows."""
    run = PerftestRun()
    for line in text.splitlines()[:MAX_LINES]:
        line = line[:4096]
        if "initializing CUDA" in line:
            run.cuda = True
        failure = next((f for f in FAILURES if f in line), None)
        if failure:
            run.errors.append(" ".join(line.split())[:200])
            continue
        match = _TEST.match(line)
        if match and not run.test:
            run.test = match.group("name")
            continue
        header = _HEADER.search(line)
        if header:
            unit = header.group("unit")
            if unit not in _TO_GBPS:
                raise UsageError(f"perftest output: unknown bandwidth unit {unit!r}",
                                 hint="expected Gb/sec, MB/sec or MiB/sec")
            run.unit = unit
            continue
        if run.unit:
            row = _ROW.match(line)
            if row:
                rate = row.group("rate")
                run.rows.append(Row(int(row.group("bytes")), int(row.group("iters")),
                                    float(row.group("peak")), float(row.group("avg")),
                                    float(rate) if rate else None))
                continue
        for key, value in _FIELD.findall(line):
            attr = {"Device": "device", "Link type": "link_type", "GID index": "gid_index"}[key]
            if not getattr(run, attr):
                setattr(run, attr, value)
    return run
