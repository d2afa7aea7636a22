"""One small line chart as SVG: evenly spaced x labels, a linear y axis, one polyline per
series, an optional shaded x range. Standard library only (no plotting package on a login
node); the whatif sweep and the nccl-tests curve draw with it."""

from __future__ import annotations

from dataclasses import dataclass
from xml.sax.saxutils import escape


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    points: list[tuple[int, float]]  # (x index into the labels, y)
    dashed: bool = False


def render(title: str, labels: list[str], series: list[Series], y_name: str, x_name: str,
           shade: tuple[int, int] | None = None) -> str:
    """The chart; ``shade`` (first, last x index) is drawn behind the lines."""
    width, height, left, top, plot_w, plot_h = 640, 360, 60, 40, 540, 260
    y_top = max((y for s in series for _, y in s.points), default=1.0) * 1.1 or 1.0

    def x(i: float) -> float:
        return left + plot_w * i / max(len(labels) - 1, 1)

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>']
    if shade is not None:
        a, b = x(shade[0] - 0.5 if shade[0] else 0), x(min(shade[1] + 0.5, len(labels) - 1))
        parts.append(f'<rect class="short" x="{a:.1f}" y="{top}" width="{b - a:.1f}" '
                     f'height="{plot_h}" fill="#fde2e2"/>')
    parts += [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
              f'y2="{top + plot_h}" stroke="black"/>',
              f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>']
    step = max(1, len(labels) // 12)  # at most about 12 tick labels
    for i, label in enumerate(labels):
        if i % step == 0 or i == len(labels) - 1:
            parts.append(f'<text x="{x(i):.1f}" y="{top + plot_h + 16}" font-size="11" '
                         f'text-anchor="middle">{escape(label)}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 16}" font-size="12" '
                 f'text-anchor="middle">{escape(x_name)}</text>')
    parts.append(f'<text x="12" y="{top - 10}" font-size="12">{escape(y_name)} '
                 f'(max {y_top:.1f})</text>')
    for k, s in enumerate(series):
        path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in s.points)
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        parts.append(f'<polyline fill="none" stroke="{s.colour}" stroke-width="2"{dash} '
                     f'points="{path}"><title>{escape(s.name)}</title></polyline>')
        parts.append(f'<text x="{left + plot_w - 150}" y="{top + 16 * (k + 1)}" '
                     f'font-size="12" fill="{s.colour}">{escape(s.name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
