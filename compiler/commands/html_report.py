"""Stage 7, render (HTML): a `Report` as one self-contained HTML page (`memspec report`).

Contract: `html(report)` returns the page as a string: inline CSS, inline SVG charts, no
script, nothing fetched, so it opens offline and can be mailed or attached to a ticket.
Every number on it comes from `render.as_data(report)` (exactly what `memspec estimate
--format json` prints), `render.table_data(report.rows)` (`memspec table --format json`) and
the API's `step_timeline`, `constants` and `layer_types`; this module only lays them out:
chart geometry and GiB labels. Each exact figure on the page carries its JSON path in a
`data-key` attribute, so a test (or a script) can compare the page with the JSON.

The templates ship inside the package (`compiler/templates/`) and load through
`jinja2.PackageLoader`, so an installed wheel renders the same page as a checkout.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from .. import api
from ..api import Report, StepTimeline
from ..pipeline.render import GIB, TABLE_COLUMNS, as_data, gib, setup_line, table_data
from ..pipeline.replay import REPLAY_ACCOUNT
from ..pipeline.simulate import CATEGORIES

MIB = 1 << 20

# Chart boxes in SVG user units (the SVGs scale to the page width).
TIMELINE_BOX = {"width": 1000, "height": 400, "left": 70, "right": 20, "top": 34, "bottom": 46}
# NB: the x axis counts events, not seconds; the loss and the optimizer step are one or two
# events among thousands, so every phase gets at least this share of the width to be seen.
MIN_PHASE_SHARE = 0.06
BARS_BOX = {"width": 1000, "label": 130, "value": 150, "row": 26, "gap": 10, "top": 8}
PHASE_NAMES = {"forward": "forward", "loss": "loss", "backward": "backward", "optimizer": "optimizer step"}
CATEGORY_NAMES = {c: c.replace("_", " ") for c in CATEGORIES}
# NB: dims last: they are long, and the bytes are what a reader scans for.
ROW_COLUMNS = tuple(c for c in TABLE_COLUMNS if c not in ("path", "dims")) + ("dims",)
# Width of one character of a 12.5 px label, to keep the phase names inside the chart.
LABEL_CHAR_WIDTH = 7.0
BYTE_COLUMNS = ("parameters", "gradients", "optimizer_states", "buffers", "activations", "held", "transient_forward", "transient_backward")


def exact(n: int) -> str:
    """Bytes as the page prints them exactly: 34,458,839,040 B."""
    return f"{n:,} B"


def size(n: int) -> str:
    """Bytes for reading, beside the exact figure: GiB (2^30) with two decimals as `memspec
    estimate` prints them, MiB (2^20) below 1 GiB where two decimals of GiB say little."""
    return f"{gib(n)} GiB" if abs(n) >= GIB else f"{n / MIB:.2f} MiB"


@lru_cache(maxsize=1)
def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("compiler", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["size"] = size
    env.filters["exact"] = exact
    return env


def html(report: Report) -> str:
    return _environment().get_template("report.html.j2").render(page(report))


def page(report: Report) -> dict[str, Any]:
    """Everything the template shows, from the estimate's JSON and the API."""
    data = as_data(report)
    timeline = api.step_timeline(report)
    steady = data["peak"]["steady_state"]
    return {
        "data": data,
        "version": _version(),
        "setup_line": setup_line(report),
        "headline": _headline(data),
        "categories": [(c, CATEGORY_NAMES[c]) for c in CATEGORIES],
        "breakdown": _breakdown(steady["breakdown"]),
        "bars": bar_chart(steady["breakdown"]),
        "timeline": timeline_chart(timeline, steady["allocated"], data["seed_sum"], data["gpu"]),
        "phases": [
            {
                "phase": PHASE_NAMES[s.phase],
                "events": s.last - s.first + 1,
                "from": timeline.events[s.first][1],
                "to": timeline.events[s.last][1],
                "high": s.high,
            }
            for s in timeline.segments
        ],
        "columns": ROW_COLUMNS,
        "byte_columns": BYTE_COLUMNS,
        "rows": table_data(report.rows),
        "seed": {"sum": data["seed_sum"], "allocated": steady["allocated"], "above": steady["allocated"] - data["seed_sum"]},
        "device_above_allocated": data["peak"]["device"] - data["peak"]["allocated"],
        "target": _target_note(data),
        "checked": _checked_note(data),
        "notes": list(report.notes),
        "spec_notes": list(report.spec.doc.data.get("notes") or ()) if isinstance(report.spec.doc.data, dict) else [],
        "constants": api.constants(report),
        "formulas": api.layer_types(report),
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memspec")
    except PackageNotFoundError:
        return "(a checkout)"


def _headline(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    peak = data["peak"]
    steady, first = peak["steady_state"], peak["first_step"]
    nccl = " + NCCL" if data["setup"]["parallel"]["dp"] > 1 else ""
    return [
        {
            "key": "peak.allocated",
            "label": "allocated",
            "bytes": peak["allocated"],
            "what": "torch.cuda.max_memory_allocated()",
            "where": f"{steady['phase']} at {steady['layer']}",
        },
        {
            "key": "peak.reserved",
            "label": "reserved",
            "bytes": peak["reserved"],
            "what": "torch.cuda.max_memory_reserved()",
            "where": REPLAY_ACCOUNT,
        },
        {"key": "peak.device", "label": "device", "bytes": peak["device"], "what": "nvidia-smi", "where": f"reserved + CUDA context{nccl}"},
        {
            "key": "peak.allocated_first_step",
            "label": "first step",
            "bytes": peak["allocated_first_step"],
            "what": "allocated, step 1",
            "where": f"{first['phase']} at {first['layer']}; optimizer states appear at its step()",
        },
    ]


def _breakdown(breakdown: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    totals = {c: sum(cats[c] for cats in breakdown.values()) for c in CATEGORIES}
    return {
        "rows": [{"module": m, "cats": cats, "total": sum(cats.values())} for m, cats in breakdown.items()],
        "totals": totals,
        "total": sum(totals.values()),
    }


def _target_note(data: Mapping[str, Any]) -> str:
    t = data["target_gpu"]
    if data["gpu"] is None:
        return (
            f"No --gpu: the cuBLAS/cuBLASLt workspaces are those of {t['key']} ({t['arch']}), the catalog's "
            "default GPU, and no capacity is drawn; pass --gpu for yours."
        )
    return f"The cuBLAS/cuBLASLt workspaces are those of {t['key']} ({t['arch']}), the GPU given."


def _checked_note(data: Mapping[str, Any]) -> str:
    """What checks this estimate: the measured records are CPU traces under an emulation of
    CUDA's allocation (docs/measuring.md), on one GPU without sharding."""
    note = (
        "The formulas are checked against measured records: training steps traced on fake tensors on CPU with "
        "CUDA's allocation behaviour emulated (docs/measuring.md; memspec validate tests/measured/)."
    )
    parallel = data["setup"]["parallel"]
    if parallel.get("fsdp"):
        note += f" FSDP2 over dp {parallel['dp']} is measured as rank 0 of a fake process group (fully_shard on the real model; docs/fsdp.md)."
    elif parallel["dp"] > 1 or parallel["zero"] > 0:
        note += (
            f" Only one GPU without sharding is measured: the dp {parallel['dp']} ZeRO-{parallel['zero']} "
            "sharding and DeepSpeed's buffers here follow DeepSpeed's source, unmeasured."
        )
    return note


def _nice_step(top: float, ticks: int = 6) -> int:
    """A tick step (1, 2 or 5 times a power of ten) giving at most `ticks` steps up to `top`."""
    return next(s * 10**k for k in range(15) for s in (1, 2, 5) if top / (s * 10**k) <= ticks)


def _axis(high: int) -> tuple[int, list[int], str]:
    """The y-axis top in bytes, 5 % above `high`, its ticks and their unit (GiB, or MiB for a
    step below 1 GiB)."""
    unit, name = (GIB, "GiB") if high * 1.05 >= GIB else (MIB, "MiB")
    step = _nice_step(high * 1.05 / unit) * unit
    top = -(-int(high * 1.05) // step) * step
    return top, list(range(0, top + 1, step)), name


def _shares(counts: list[int]) -> list[float]:
    """Each phase's share of the width: its share of the events, but at least MIN_PHASE_SHARE;
    the phases above that split the rest in proportion to their events."""
    small: set[int] = set()
    while True:
        rest = 1 - MIN_PHASE_SHARE * len(small)
        big = sum(n for i, n in enumerate(counts) if i not in small)
        if not big:  # NB: only with more than 1 / MIN_PHASE_SHARE phases, which a step has not
            return [1 / len(counts)] * len(counts)
        grown = {i for i, n in enumerate(counts) if i not in small and n / big * rest < MIN_PHASE_SHARE}
        if not grown:
            return [MIN_PHASE_SHARE if i in small else n / big * rest for i, n in enumerate(counts)]
        small |= grown


def timeline_chart(t: StepTimeline, peak: int, seed_sum: int, gpu: Mapping[str, Any] | None) -> dict[str, Any]:
    """The step's allocated bytes as a step curve, phases as bands, the peak marked, and
    horizontal lines at the seed paper's sum and at the GPU's capacity."""
    box = TIMELINE_BOX
    plot_w = box["width"] - box["left"] - box["right"]
    plot_h = box["height"] - box["top"] - box["bottom"]
    capacity = gpu["memory"] if gpu else 0
    top, ticks, unit = _axis(max(peak, seed_sum, capacity))
    per_unit = GIB if unit == "GiB" else MIB

    def y(n: int) -> float:
        return round(box["top"] + plot_h * (1 - n / top), 1)

    n_events = len(t.events)
    shares = _shares([s.last - s.first + 1 for s in t.segments])
    bands, edges = [], []  # edges[i]: (x0, x1) of event i
    x = float(box["left"])
    for s, share in zip(t.segments, shares):
        w = share * plot_w
        half = len(PHASE_NAMES[s.phase]) * LABEL_CHAR_WIDTH / 2
        mid = min(max(x + w / 2, box["left"] + half), box["left"] + plot_w - half)
        bands.append({"phase": s.phase, "name": PHASE_NAMES[s.phase], "x": round(x, 1), "w": round(w, 1), "mid": round(mid, 1)})
        step = w / (s.last - s.first + 1)
        edges.extend((x + k * step, x + (k + 1) * step) for k in range(s.last - s.first + 1))
        x += w
    base = y(0)
    parts = [f"M{edges[0][0]:.1f},{base}"]
    last_y = None
    for (x0, x1), (_, _, total) in zip(edges, t.events):
        yy = y(total)
        if yy != last_y:
            parts.append(f"L{x0:.1f},{yy}")
            last_y = yy
        parts.append(f"L{x1:.1f},{yy}")
    line = "M" + " ".join(p[1:] for p in parts[1:])
    area = " ".join(parts) + f" L{edges[-1][1]:.1f},{base} Z"
    px = (edges[t.peak][0] + edges[t.peak][1]) / 2
    phase, layer, total = t.events[t.peak]
    right = px > box["left"] + plot_w / 2
    return {
        "box": box,
        "plot": {"x": box["left"], "y": box["top"], "w": plot_w, "h": plot_h, "bottom": base, "right": box["left"] + plot_w},
        "ticks": [{"y": y(v), "label": f"{v / per_unit:g}"} for v in ticks],
        "unit": unit,
        "bands": bands,
        "area": area,
        "line": line,
        "peak": {
            "x": round(px, 1),
            "y": y(total),
            "bytes": total,
            "phase": phase,
            "layer": layer,
            "anchor": "end" if right else "start",
            "tx": round(px - 8 if right else px + 8, 1),
            "ty": max(y(total) - 10, box["top"] + 12),
        },
        "seed": {"y": y(seed_sum), "bytes": seed_sum},
        "capacity": {"y": y(capacity), "bytes": capacity, "key": gpu["key"]} if gpu else None,
        "events": n_events,
    }


def bar_chart(breakdown: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """One horizontal bar per module (and the workspaces and buffers rows), stacked by factor,
    on one scale: the longest bar is the largest row."""
    box = BARS_BOX
    rows = [(m, cats) for m, cats in breakdown.items() if sum(cats.values())]
    high = max((sum(c.values()) for _, c in rows), default=1) or 1
    plot_w = box["width"] - box["label"] - box["value"]
    out = []
    for i, (module, cats) in enumerate(rows):
        y = box["top"] + i * (box["row"] + box["gap"])
        x = float(box["label"])
        segments = []
        for c in CATEGORIES:
            w = cats[c] / high * plot_w
            if cats[c]:
                segments.append({"category": c, "name": CATEGORY_NAMES[c], "x": round(x, 2), "w": round(max(w, 0.5), 2), "bytes": cats[c]})
            x += w
        out.append({"module": module, "y": y, "mid": y + box["row"] / 2, "segments": segments, "total": sum(cats.values()), "end": round(x + 6, 1)})
    height = box["top"] * 2 + len(rows) * (box["row"] + box["gap"]) - box["gap"]
    return {"box": box, "rows": out, "height": height}
