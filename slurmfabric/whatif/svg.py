"""The ``whatif --sweep`` plot: step time against node count, one line per fabric.

The rows are what ``model.sweep`` returns, so the picture and the table never disagree; the
drawing is ``_common/svgchart`` (node counts evenly spaced: the sweep's counts are powers of
two, so this is a log2 x axis).
"""

from __future__ import annotations

from slurmfabric._common import svgchart

COLOURS = {"ib": "#1f77b4", "roce": "#2ca02c", "tcp": "#d62728", "efa": "#9467bd"}


def render(rows: list[dict], title: str) -> str:
    """Step time against node count, one line per fabric."""
    counts = sorted({r["nodes"] for r in rows})
    series = [svgchart.Series(fabric, COLOURS.get(fabric, "black"),
                              [(counts.index(r["nodes"]), r["step_s"])
                               for r in rows if r["fabric"] == fabric])
              for fabric in sorted({r["fabric"] for r in rows})]
    return svgchart.render(title, [str(n) for n in counts], series, "step s", "nodes")
