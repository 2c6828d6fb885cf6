"""The chart of `memspec sweep --svg`: the device figure against one swept knob.

Contract: `sweep_svg(report, x)` returns a self-contained SVG document (no scripts, fonts or
stylesheets from elsewhere): one line per combination of the other knobs' values, a legend,
and the GPU's memory as a dashed horizontal line (`class="capacity"`), the GPU asked about or
else the default target of `specs/gpus.yaml`. The y axis is the `device` figure because
that is what a GPU's memory must hold (the figure `fits` compares). The x axis places the
knob's values evenly in the order swept, so a doubling range reads as a log scale.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence
from xml.sax.saxutils import escape, quoteattr

from ..errors import Diagnostic, UsageError
from .sweep import BY_NAME, SweepReport, describe

GIB = 1 << 30
WIDTH, HEIGHT = 860, 480  # the smallest page; taller when the legend needs it
LEGEND_ROW = 18
LEFT, RIGHT, TOP, BOTTOM = 72, 250, 48, 56
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")


def x_knob(grid: Mapping[str, Sequence[Any]], wanted: str | None) -> str:
    """The knob on the x axis: `wanted` (a flag name with or without dashes), else the first
    knob swept over two or more values."""
    if wanted:
        name = wanted.lstrip("-").replace("-", "_")
        if name == "lora_r":
            name = "lora_rank"
        if name not in grid:
            swept = ", ".join(BY_NAME[k].flag for k in grid) or "none"
            raise UsageError(Diagnostic("E914", "", 0, 0, "--x", f"'{wanted}' is not a swept knob", f"swept knobs: {swept}"))
        return name
    for name, values in grid.items():
        if len(values) > 1:
            return name
    raise UsageError(
        Diagnostic("E914", "", 0, 0, "--svg", "a chart needs a knob swept over two or more values", "e.g. --seq-len 1024:8192:x2, or leave out --svg")
    )


def _step(top: float) -> float:
    """A round GiB tick step giving at most 8 ticks up to `top`."""
    scale = 1.0
    while True:
        for m in (1, 2, 5):
            if top / (m * scale) <= 8:
                return m * scale
        scale *= 10


def sweep_svg(report: SweepReport, wanted: str | None = None) -> str:
    x = x_knob(report.grid, wanted)
    xs = list(report.grid[x])
    gpu = report.capacity_gpu
    lines: dict[tuple, list[tuple[int, int]]] = {}
    labels: dict[tuple, str] = {}
    for row in report.rows:
        others = tuple((k, v) for k, v in row.point.items() if k != x and len(report.grid[k]) > 1)
        lines.setdefault(others, []).append((xs.index(row.point[x]), row.report.device))
        labels[others] = describe(dict(others)) or "device"
    fixed = describe({k: v[0] for k, v in report.grid.items() if len(v) == 1})
    top_bytes = max([gpu.memory] + [y for pts in lines.values() for _, y in pts]) * 1.08
    top = top_bytes / GIB
    height = max(HEIGHT, TOP + 8 + LEGEND_ROW * len(lines) + BOTTOM)  # NB: the legend never runs off the page
    plot_w, plot_h = WIDTH - LEFT - RIGHT, height - TOP - BOTTOM

    def px(i: int) -> float:
        return LEFT + (plot_w * (i + 0.5) / len(xs))

    def py(b: float) -> float:
        return TOP + plot_h * (1 - b / top_bytes)

    title = f"{report.base.experiment}: device memory per GPU vs {BY_NAME[x].flag[2:]}"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="24" font-size="15">{escape(title)}</text>',
    ]
    if fixed:
        out.append(f'<text x="{LEFT}" y="40" fill="#555">{escape(fixed)}</text>')
    step = _step(top)
    tick = 0.0
    while tick <= top:
        y = py(tick * GIB)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>')
        tick += step
    out.append(
        f'<text x="16" y="{TOP + plot_h / 2:.1f}" transform="rotate(-90 16 {TOP + plot_h / 2:.1f})" text-anchor="middle">device memory (GiB = 2^30 B, nvidia-smi)</text>'
    )
    for i, v in enumerate(xs):
        out.append(f'<text x="{px(i):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{escape(str(v))}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{height - 14}" text-anchor="middle">{escape(BY_NAME[x].flag[2:])}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    cap = py(gpu.memory)
    cap_label = f"{gpu.key}: {gpu.memory / GIB:.2f} GiB" + ("" if report.gpu is not None else " (default GPU)")
    out.append(
        f'<line class="capacity" x1="{LEFT}" y1="{cap:.1f}" x2="{LEFT + plot_w}" y2="{cap:.1f}" stroke="black" stroke-width="1.5" stroke-dasharray="6 4"><title>{escape(cap_label)}</title></line>'
    )
    out.append(f'<text x="{LEFT + 4}" y="{cap - 5:.1f}">{escape(cap_label)}</text>')  # NB: left, where the lines are lowest
    for n, (key, pts) in enumerate(lines.items()):
        color = PALETTE[n % len(PALETTE)]
        path = " ".join(f"{px(i):.1f},{py(b):.1f}" for i, b in pts)
        out.append(f'<g class="series" stroke={quoteattr(color)} fill={quoteattr(color)}>')
        out.append(f"<title>{escape(labels[key])}</title>")
        out.append(f'<polyline points="{path}" fill="none" stroke-width="2"/>')
        for i, b in pts:
            out.append(
                f'<circle cx="{px(i):.1f}" cy="{py(b):.1f}" r="3.5"><title>{escape(f"{labels[key]}, {BY_NAME[x].flag[2:]} {xs[i]}: {b:,} B ({b / GIB:.2f} GiB)")}</title></circle>'
            )
        out.append("</g>")
        ly = TOP + 8 + LEGEND_ROW * n
        out.append(f'<line x1="{WIDTH - RIGHT + 16}" y1="{ly}" x2="{WIDTH - RIGHT + 40}" y2="{ly}" stroke={quoteattr(color)} stroke-width="2"/>')
        out.append(f'<text class="legend" x="{WIDTH - RIGHT + 46}" y="{ly + 4}">{escape(labels[key])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
