"""Bus bandwidth against message size: an nccl-tests sweep beside the curve its fabric should
give, and the size range where it falls short.

The expected curve is the whatif collective model (``whatif/collectives.py``: NCCL's
algorithms, their bandwidth and latency for this op, node count, GPUs and rails), the same
model ``whatif`` and ``pairs report`` use, so a judgement here and a price there agree.
A size is judged from 1 MiB up; below, one collective is a few tens of microseconds of
launch and synchronisation that vary by machine more than the fabric does, so the rows are
drawn but not judged. The tolerance is the published spread of healthy runs around the NIC
bound (``BUSBW_TOLERANCE``, 10 %) from 256 MiB, where the model's held-out error is under
4 %, and 25 % between 1 and 256 MiB, where the latency term dominates
(docs/whatif.md, the calibration table). A sweep that ends below 1 GiB, where bus
bandwidth saturates, cannot show the plateau: above its last size the verdict is "cannot
tell", never OK.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurmfabric._common import svgchart

JUDGED_FROM = 1 << 20
PLATEAU_FROM = 1 << 30
LARGE_FROM = 256 << 20
# nccl-tests' binaries -> the model's op (nccl-tests doc/PERFORMANCE.md bus factors)
OPS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
       "reduce_scatter_perf": "reduce_scatter"}


@dataclass(frozen=True)
class Shape:
    nodes: int
    gpus_per_node: int
    rates_gbps: tuple[float, ...]  # rail NICs per node
    fabric: str = "ib"
    gpu: str = "h100"
    algo: str | None = None  # NCCL_ALGO the run forced (ring, tree, nvls...); None: NCCL's pick


@dataclass
class Point:
    size: int
    busbw: float
    expected: float | None
    short: bool = False


@dataclass
class Curve:
    op: str | None
    points: list[Point]
    state: str  # OK, SHORT, CANNOT_TELL
    findings: list[str] = field(default_factory=list)


def size_label(size: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def tolerance(size: int) -> float:
    from slurmfabric.whatif.model import BUSBW_TOLERANCE

    return BUSBW_TOLERANCE if size >= LARGE_FROM else 0.25


def expected(op: str, shape: Shape, size: int) -> float:
    """The busbw nccl-tests should print for ``size`` bytes on this shape (GB/s)."""
    from slurmfabric.whatif import collectives
    from slurmfabric.whatif.model import Job

    job = Job(params=1.0, nodes=shape.nodes, gpus_per_node=shape.gpus_per_node,
              fabric=shape.fabric, port_rate=min(shape.rates_gbps) if shape.rates_gbps
              else 400.0, nics=len(shape.rates_gbps) or None, gpu=shape.gpu)
    return collectives.busbw_at(job, op, size, shape.algo)[0]


def judge(collective: str | None, rows: list[tuple[int, float]], shape: Shape) -> Curve:
    """Each (size, busbw) row against the expected curve; the sizes that fall short, as one
    range or several, and whether the sweep reaches the plateau at all."""
    op = OPS.get((collective or "").strip())
    if op is None:
        return Curve(op, [Point(s, b, None) for s, b in rows], "CANNOT_TELL", [
            f"cannot tell: no model of {collective or 'this collective'}'s curve "
            f"(modelled: {', '.join(sorted(OPS))})"])
    points = []
    for size, busbw in sorted(rows):
        want = expected(op, shape, size) if size > 0 else None
        short = (want is not None and size >= JUDGED_FROM
                 and busbw < want * (1 - tolerance(size)))
        points.append(Point(size, busbw, want, short))
    findings, state = [], "OK"
    ranges = _ranges(points)
    for first, last in ranges:
        a, b = points[first], points[last]
        worst = min(points[first:last + 1], key=lambda p: p.busbw / (p.expected or 1))
        findings.append(
            f"short of the expected curve from {size_label(a.size)} to {size_label(b.size)}: "
            f"at {size_label(worst.size)} {worst.busbw:.1f} GB/s against "
            f"{worst.expected:.1f} expected ({100 * worst.busbw / (worst.expected or 1):.0f} %)")
        state = "SHORT"
    top = points[-1].size if points else 0
    if not [p for p in points if p.size >= JUDGED_FROM]:
        findings.append(f"cannot tell: no size of {size_label(JUDGED_FROM)} or more (the sweep "
                        f"ends at {size_label(top)}); rerun with -b 1M -e 8G -f 2")
        state = "CANNOT_TELL" if state == "OK" else state
    elif top < PLATEAU_FROM:
        findings.append(f"cannot tell above {size_label(top)}: bus bandwidth saturates from "
                        f"{size_label(PLATEAU_FROM)}; rerun up to -e 8G")
        state = "CANNOT_TELL" if state == "OK" else state
    if state == "OK":
        judged = [p for p in points if p.size >= JUDGED_FROM]
        findings.append(f"within the expected curve from {size_label(judged[0].size)} to "
                        f"{size_label(judged[-1].size)}")
    return Curve(op, points, state, findings)


def _ranges(points: list[Point]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i, p in enumerate(points):
        if not p.short:
            continue
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def svg(curve: Curve, title: str) -> str:
    """Measured and expected busbw per size (sizes evenly spaced: nccl-tests' -f 2 sweep is a
    log2 axis), the first short range shaded."""
    labels = [size_label(p.size) for p in curve.points]
    series = [svgchart.Series("measured busbw", "#1f77b4",
                              [(i, p.busbw) for i, p in enumerate(curve.points)])]
    want = [(i, float(p.expected)) for i, p in enumerate(curve.points)
            if p.expected is not None]
    if want:
        series.append(svgchart.Series("expected", "#555555", want, dashed=True))
    short = _ranges(curve.points)
    shade = short[0] if short else None
    return svgchart.render(title, labels, series, "busbw GB/s", "message size (bytes)", shade)


def html(curve: Curve, title: str) -> str:
    """A self-contained page: the chart, the verdict and the table (no script, no request)."""
    from html import escape

    marks = {True: ' class="short"', False: ""}
    rows = "".join(
        f"<tr{marks[p.short]}><td>{p.size}</td><td>{p.busbw:.2f}</td>"
        f"<td>{'' if p.expected is None else format(p.expected, '.2f')}</td></tr>"
        for p in curve.points)
    notes = "".join(f"<li>{escape(f)}</li>" for f in curve.findings)
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'\">"
        f"<title>{escape(title)}</title><style>td{{padding:0 12px;text-align:right}}"
        "tr.short{background:#fde2e2}</style></head><body>"
        f"<h1>{escape(title)}</h1><p>result: <strong>{curve.state}</strong></p><ul>{notes}</ul>"
        f"{svg(curve, title)}<table><tr><th>size (B)</th><th>busbw GB/s</th>"
        f"<th>expected GB/s</th></tr>{rows}</table></body></html>\n")
