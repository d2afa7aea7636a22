"""The ``whatif --sweep`` plot: step time against node count, one line per fabric.

Standard library only (no plotting package on a login node); the rows are what
``model.sweep`` returns, so the picture and the table never disagree.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

COLOURS = {"ib": "#1f77b4", "roce": "#2ca02c", "tcp": "#d62728", "efa": "#9467bd"}


def render(rows: list[dict], title: str) -> str:
    """Step time against node count, one line per fabric (node counts evenly spaced: the
    sweep's counts are powers of two, so this is a log2 x axis)."""
    width, height, left, top, plot_w, plot_h = 640, 360, 60, 40, 540, 260
    counts = sorted({r["nodes"] for r in rows})
    top_s = max(r["step_s"] for r in rows) * 1.1

    def x(n: int) -> float:
        span = max(len(counts) - 1, 1)
        return left + plot_w * counts.index(n) / span

    def y(s: float) -> float:
        return top + plot_h * (1 - s / top_s)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>',
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
             f'y2="{top + plot_h}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>']
    for n in counts:
        parts.append(f'<text x="{x(n):.1f}" y="{top + plot_h + 16}" font-size="11" '
                     f'text-anchor="middle">{n}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 16}" font-size="12" '
                 'text-anchor="middle">nodes</text>')
    parts.append(f'<text x="12" y="{top - 10}" font-size="12">step s (max {top_s:.1f})'
                 '</text>')
    for k, fabric in enumerate(sorted({r["fabric"] for r in rows})):
        points = [(x(r["nodes"]), y(r["step_s"])) for r in rows if r["fabric"] == fabric]
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        colour = COLOURS.get(fabric, "black")
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                     f'points="{path}"/>')
        parts.append(f'<text x="{left + plot_w - 60}" y="{top + 16 * (k + 1)}" '
                     f'font-size="12" fill="{colour}">{escape(fabric)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
