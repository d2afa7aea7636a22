"""An SVG heatmap of the pair matrix that a person reads at a glance.

Cells are coloured by their share of the reference bandwidth (red at <= 50 %, amber at the
low threshold, green at >= 100 %), labelled with GB/s; rows and columns carry node names;
suspects are named under the matrix. Plain SVG 1.1 text, standard library only.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

CELL = 64
MARGIN = 12


def _colour(fraction: float | None) -> str:
    """Red -> amber -> green over 0.5 .. 1.0 of the reference."""
    if fraction is None:
        return "#d9d9d9"
    f = max(0.0, min(1.0, (fraction - 0.5) / 0.5))
    if f < 0.6:  # red to amber
        t = f / 0.6
        r, g, b = 215, int(48 + (170 - 48) * t), 39
    else:  # amber to green
        t = (f - 0.6) / 0.4
        r, g, b = int(215 - (215 - 26) * t), int(170 - (170 - 150) * t), int(39 + (65 - 39) * t)
    return f"#{r:02x}{g:02x}{b:02x}"


def _open_svg(width: int, height: int, title: str) -> list[str]:
    """The document head both plots share: a white page and the title."""
    return [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{MARGIN}" y="24" font-size="16" font-weight="bold">{escape(title)}</text>',
    ]


def render_svg(nodes: list[str], m: list[list[float | None]], reference: float | None,
               title: str, notes: list[str], failed: set[frozenset] | None = None) -> str:
    failed = failed or set()
    label_w = max(60, 9 * max(len(n) for n in nodes) + 16)
    n = len(nodes)
    width = max(label_w + n * CELL + 2 * MARGIN, 520)
    height = 40 + label_w + n * CELL + 24 + 18 * (len(notes) + 1) + MARGIN
    top = 40 + label_w
    parts = _open_svg(width, height, title)
    for j, name in enumerate(nodes):
        x = MARGIN + label_w + j * CELL + CELL // 2
        parts.append(f'<text x="{x}" y="{top - 8}" font-size="13" text-anchor="start" '
                     f'transform="rotate(-60 {x} {top - 8})">{escape(name)}</text>')
    for i, row_name in enumerate(nodes):
        y = top + i * CELL
        parts.append(f'<text x="{MARGIN + label_w - 8}" y="{y + CELL // 2 + 5}" font-size="13" '
                     f'text-anchor="end">{escape(row_name)}</text>')
        for j, col_name in enumerate(nodes):
            x = MARGIN + label_w + j * CELL
            value = m[i][j]
            if i == j:
                fill, text = "#f2f2f2", "-"
            elif frozenset((row_name, col_name)) in failed:
                fill, text = "#7f0000", "FAIL"
            elif value is None:
                fill, text = "#d9d9d9", "n/a"
            else:
                fill = _colour(value / reference if reference else None)
                text = f"{value:.0f}"
            parts.append(f'<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" '
                         f'fill="{fill}" stroke="white" stroke-width="2">'
                         f'<title>{escape(row_name)} + {escape(col_name)}: {text}</title></rect>')
            colour = "white" if fill in ("#7f0000",) or text not in ("-", "n/a") else "#333"
            parts.append(f'<text x="{x + CELL // 2}" y="{y + CELL // 2 + 5}" font-size="13" '
                         f'text-anchor="middle" fill="{colour}">{escape(text)}</text>')
    return _finish(parts, top + n * CELL + 24, "busbw in GB/s; reference {ref}; red = half of "
                   "it, green = at or above it", reference, notes)


def _finish(parts: list[str], y: int, legend: str, reference: float | None,
            notes: list[str]) -> str:
    """The legend line (``{ref}`` filled in), the notes in red, and the closing tag."""
    ref = "n/a" if reference is None else f"{reference:.1f} GB/s"
    parts.append(f'<text x="{MARGIN}" y="{y}" font-size="12">'
                 f'{escape(legend.format(ref=ref))}</text>')
    for k, note in enumerate(notes):
        parts.append(f'<text x="{MARGIN}" y="{y + 18 * (k + 1)}" font-size="12" '
                     f'fill="#7f0000">{escape(note)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


BAR_H = 14
BARS_FROM = 33  # nodes from which the SVG shows one bar per node instead of the matrix


def render_bars(nodes: list[str], medians: dict[str, float | None], reference: float | None,
                title: str, notes: list[str], suspects: set[str] | None = None) -> str:
    """One horizontal bar per node (its median pair bandwidth), lowest first: readable at
    256 nodes and more, where a matrix has 65,536 cells. Suspects are labelled in red."""
    suspects = suspects or set()
    order = sorted(nodes, key=lambda n: (medians.get(n) is None, medians.get(n) or 0.0, n))
    label_w = max(60, 8 * max(len(n) for n in nodes) + 16)
    plot_w = 560
    top = 44
    height = top + len(order) * BAR_H + 30 + 18 * len(notes) + MARGIN
    width = MARGIN * 2 + label_w + plot_w + 70
    top_value = max([v for v in medians.values() if v is not None] + [reference or 0.0, 1e-9])
    parts = _open_svg(width, height, title)
    for i, node in enumerate(order):
        y = top + i * BAR_H
        value = medians.get(node)
        colour = "#7f0000" if node in suspects else "#333"
        parts.append(f'<text x="{MARGIN + label_w - 6}" y="{y + BAR_H - 3}" font-size="11" '
                     f'text-anchor="end" fill="{colour}">{escape(node)}</text>')
        if value is None:
            continue
        length = plot_w * value / top_value
        fill = _colour(value / reference if reference else None)
        parts.append(f'<rect x="{MARGIN + label_w}" y="{y + 1}" width="{length:.1f}" '
                     f'height="{BAR_H - 2}" fill="{fill}"><title>{escape(node)}: '
                     f'{value:.1f} GB/s</title></rect>')
        parts.append(f'<text x="{MARGIN + label_w + length + 4:.1f}" y="{y + BAR_H - 3}" '
                     f'font-size="10">{value:.0f}</text>')
    return _finish(parts, top + len(order) * BAR_H + 20, "median busbw per node in GB/s, "
                   "lowest first; reference {ref}; suspects in red", reference, notes)
