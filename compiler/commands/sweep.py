"""`memspec sweep`: one estimate per point of the cartesian product of knob values.

Contract: `parse_values(knob, text)` reads a value list written on the command line
(`1,2,4,8`, `1024:8192:x2`, `1:16:+4`, `on,off`, `off,8,64`) and raises a `UsageError`
(E911-E913) naming the flag and what would be right; `grid_points(grid)` is the product in
the order the knobs are listed in `KNOBS`; `sweep(spec, doc, base, grid, ...)` resolves every
point's setup first (so that a bad point stops the sweep before any work) and then runs
expand -> evaluate -> simulate on the spec and formula library loaded once, as `fit` does.
Every row is what `memspec estimate` gives with the same flags: the point's overrides go
through `api.admitted_setup` exactly as the estimate's do.

The knob `gradient_checkpointing` takes `on`, `off` or modules joined by `+`
(`language+vision`). `on` is the experiment's checkpointed modules when it names any, else
`language` when the model has that module (what Hugging Face's `--gradient_checkpointing
True` reaches in LLaVA, see `compiler/inputs/launch.py`), else every module. `lora_rank` takes
ranks and `off` (no LoRA); a rank keeps the rest of the experiment's `lora` block and the
`--lora-*` flags.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, TextIO

from ..errors import Diagnostic, MemspecError, UsageError

if TYPE_CHECKING:  # NB: the CLI builds its flags from KNOBS; estimating imports stay lazy
    from ..api import Report
    from ..pipeline.load import Document
    from ..pipeline.resolve import Gpu, Setup, Spec

# Most points one sweep may have: beyond this it is a typo in a range, not a question.
MAX_POINTS = 10_000


@dataclass(frozen=True)
class Knob:
    name: str  # the row's column and the override key (lora_rank: lora.r)
    flag: str
    kind: str  # int | choice | checkpointing | lora
    minimum: int = 0
    choices: tuple[str, ...] = ()
    example: str = ""


KNOBS: tuple[Knob, ...] = (
    Knob("micro_batch", "--micro-batch", "int", 1, example="1,2,4,8 or 1:16:x2"),
    Knob("seq_len", "--seq-len", "int", 1, example="1024:8192:x2 or 1024,2048"),
    Knob("images_per_sample", "--images-per-sample", "int", 0, example="0,1,2"),
    Knob("dp", "--dp", "int", 1, example="1,2,4,8"),
    Knob("zero", "--zero", "choice", choices=("0", "1", "2", "3"), example="0,2,3"),
    Knob("gradient_checkpointing", "--gradient-checkpointing", "checkpointing", example="on,off or language+vision,off"),
    Knob("lora_rank", "--lora-rank", "lora", 1, example="8,16,64 or off,8"),
    # NB: the choices of resolve.ATTENTION and resolve.PRECISION_NAMES (tests/test_sweep.py holds them equal)
    Knob("attention", "--attention", "choice", choices=("flash_attention_2", "sdpa", "eager"), example="sdpa,eager"),
    Knob(
        "precision",
        "--precision",
        "choice",
        choices=("bf16-mixed", "16-mixed", "bf16-true", "16-true", "32-true", "32", "bf16", "fp16-mixed", "fp32"),
        example="bf16-mixed,bf16",
    ),
)
BY_NAME = {k.name: k for k in KNOBS}


def _bad(knob: Knob, code: str, message: str, help: str | None = None) -> UsageError:
    return UsageError(Diagnostic(code, "", 0, 0, knob.flag, message, help or f"write a comma-separated list, e.g. {knob.flag} {knob.example}"))


def _int(knob: Knob, text: str, part: str) -> int:
    try:
        return int(part)
    except ValueError:
        raise _bad(knob, "E911", f"'{part}' in '{text}' is not an integer") from None


def _range(knob: Knob, text: str, item: str) -> list[int]:
    """`start:stop[:step]`, stop included when the steps reach it: step `xK` multiplies by K,
    `+K` or `K` adds K, no step adds 1."""
    parts = item.split(":")
    if len(parts) not in (2, 3):
        raise _bad(knob, "E911", f"'{item}' is not a range", "a range is start:stop[:step], e.g. 1024:8192:x2 (doubling) or 1:16:+4")
    start, stop = _int(knob, text, parts[0]), _int(knob, text, parts[1])
    step = parts[2] if len(parts) == 3 else "+1"
    geometric = step.startswith("x")
    by = _int(knob, text, step.lstrip("x+"))
    if start > stop:
        raise _bad(
            knob, "E912", f"range '{item}' runs backwards (start {start} > stop {stop})", f"write {stop}:{start}" + (f":{step}" if len(parts) == 3 else "")
        )
    if geometric and (by < 2 or start < 1):
        raise _bad(knob, "E912", f"range '{item}': a multiplying step needs a factor >= 2 and a start >= 1", "e.g. 1024:8192:x2")
    if not geometric and by < 1:
        raise _bad(knob, "E912", f"range '{item}': the step must be >= 1", "e.g. 1:16:+4")
    out, x = [], start
    while x <= stop:
        out.append(x)
        if len(out) > MAX_POINTS:
            raise _bad(knob, "E912", f"range '{item}' has more than {MAX_POINTS:,} values", "use a larger step")
        x = x * by if geometric else x + by
    return out


def parse_values(knob: Knob | str, text: str) -> list[Any]:
    """The values a flag lists, in order, duplicates dropped: ints for integer knobs (and
    LoRA ranks), strings otherwise ('off' for no LoRA)."""
    knob = BY_NAME[knob] if isinstance(knob, str) else knob
    items = [x.strip() for x in text.split(",")]
    if not text.strip() or any(not x for x in items):
        raise _bad(knob, "E911", f"empty value in '{text}'")
    values: list[Any] = []
    for item in items:
        if knob.kind == "int" or (knob.kind == "lora" and item.lower() not in ("off", "none")):
            got = _range(knob, text, item) if ":" in item else [_int(knob, text, item)]
            low = [v for v in got if v < knob.minimum]
            if low:
                raise _bad(
                    knob, "E913", f"{low[0]} is below the smallest {knob.name.replace('_', ' ')}, {knob.minimum}", f"every value must be >= {knob.minimum}"
                )
            values += got
        elif knob.kind == "lora":
            values.append("off")
        elif knob.kind == "choice":
            if item not in knob.choices:
                from ..errors import did_you_mean

                raise _bad(
                    knob, "E913", f"'{item}' is not one of {', '.join(knob.choices)}", did_you_mean(item, knob.choices) or f"e.g. {knob.flag} {knob.example}"
                )
            values.append(int(item) if knob.name == "zero" else item)
        else:  # checkpointing
            if item.lower() in ("on", "off"):
                values.append(item.lower())
            elif all(part.strip() for part in item.split("+")):
                values.append("+".join(part.strip() for part in item.split("+")))
            else:
                raise _bad(knob, "E913", f"'{item}' is neither on, off nor modules joined by '+'", f"e.g. {knob.flag} {knob.example}")
    return list(dict.fromkeys(values))


def grid_points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The cartesian product, knobs in `KNOBS` order, the last knob varying fastest."""
    names = [k.name for k in KNOBS if k.name in grid]
    size = 1
    for n in names:
        size *= len(grid[n])
    if size > MAX_POINTS:
        counts = " x ".join(f"{len(grid[n])} {BY_NAME[n].flag[2:]}" for n in names)
        raise UsageError(Diagnostic("E912", "", 0, 0, "", f"the sweep has {size:,} points ({counts}), more than {MAX_POINTS:,}", "sweep fewer values at once"))
    return [dict(zip(names, combo)) for combo in itertools.product(*(grid[n] for n in names))]


def describe(point: Mapping[str, Any]) -> str:
    """'micro-batch 4, seq-len 2048' (flags without dashes) for messages and legends."""
    return ", ".join(f"{BY_NAME[k].flag[2:]} {v}" for k, v in point.items())


def checkpointing_on(spec: Spec, doc: Document | None) -> list[str]:
    """The modules `--gradient-checkpointing on` checkpoints (see the module docstring)."""
    named = list((doc.data.get("gradient_checkpointing") or []) if doc is not None else [])
    if named:
        return named
    names = [m.name for m in spec.modules]
    return ["language"] if "language" in names else names


def point_overrides(point: Mapping[str, Any], base: Mapping[str, Any], on: Sequence[str]) -> dict[str, Any]:
    """The estimate overrides of one point on top of the fixed ones (`base`)."""
    out = dict(base)
    for name, value in point.items():
        if name == "gradient_checkpointing":
            out[name] = list(on) if value == "on" else [] if value == "off" else value.split("+")
        elif name == "lora_rank":
            out["lora"] = None if value == "off" else {**(base.get("lora") or {}), "r": value}
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class Row:
    point: Mapping[str, Any]
    report: Report

    @property
    def fits(self) -> bool | None:
        """The estimate's verdict: within the GPU's memory less the margin, no OOM in the replay."""
        return self.report.fits

    @property
    def headroom(self) -> int | None:
        gpu = self.report.gpu
        return None if gpu is None else gpu.memory - self.report.device


@dataclass(frozen=True)
class SweepReport:
    spec: Spec
    base: Setup  # the first point's setup: what the knobs left alone
    grid: Mapping[str, Sequence[Any]]
    rows: tuple[Row, ...]

    @property
    def gpu(self) -> Gpu | None:
        return self.base.gpu

    @property
    def capacity_gpu(self) -> Gpu:
        """The GPU whose memory the chart draws: the one asked about, else the default target."""
        return self.base.gpu or self.base.target


def resolve_points(spec: Spec, doc: Document | None, base: Mapping[str, Any], points: Iterable[Mapping[str, Any]]) -> list[Setup]:
    """Every point's setup; the diagnostics of bad points are raised together, each message
    ending with the point it belongs to."""
    from ..api import admitted_setup

    on = checkpointing_on(spec, doc)
    setups: list[Setup] = []
    problems: list[Diagnostic] = []
    usage = True
    for point in points:
        try:
            setups.append(admitted_setup(doc, spec, point_overrides(point, base, on)))
        except MemspecError as exc:
            usage = usage and isinstance(exc, UsageError)
            problems += [replace(d, message=f"{d.message}; sweep point {describe(point)}") for d in exc.diagnostics]
            if len(problems) >= 20:
                break  # NB: one bad value usually spoils a whole slice of the grid; 20 say enough
    if problems:
        raise (UsageError if usage else MemspecError)(list(dict.fromkeys(problems)))
    return setups


def sweep(
    spec: Spec,
    doc: Document | None,
    base: Mapping[str, Any],
    grid: Mapping[str, Sequence[Any]],
    progress: Callable[[int, int, Mapping[str, Any]], None] | None = None,
) -> SweepReport:
    from ..api import run, spec_library

    points = grid_points(grid)
    setups = resolve_points(spec, doc, base, points)
    lib = spec_library(spec)
    rows = []
    reuse: dict = {}  # each module's layers, expanded and evaluated once per distinct input (api.run)
    first: dict[tuple, Row] = {}  # the first row of each point less its dp
    for i, (point, setup) in enumerate(zip(points, setups)):
        if progress is not None:
            progress(i, len(points), point)
        # NB: expand and evaluate do not read dp: points whose setups differ in it alone
        # simulate one set of layers (each rank's share is the walks')
        key = tuple((k, repr(v)) for k, v in point.items() if k != "dp")
        seen = first.get(key)
        nodes = seen.report.nodes if seen is not None and replace(seen.report.setup, dp=setup.dp) == setup else None
        rows.append(Row(point, run(spec, setup, lib, table=False, nodes=nodes, reuse=reuse)))
        first.setdefault(key, rows[-1])
    if progress is not None:
        progress(len(points), len(points), {})
    return SweepReport(spec, setups[0], dict(grid), tuple(rows))


class ProgressBar:
    """`[#####.....] 12/288 micro-batch 4, seq-len 2048` rewritten in place on a terminal."""

    WIDTH = 30

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.last = 0

    def __call__(self, done: int, total: int, point: Mapping[str, Any]) -> None:
        if done >= total:
            self.stream.write("\r" + " " * self.last + "\r")
            self.stream.flush()
            return
        filled = self.WIDTH * done // total
        line = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total} {describe(point)}"
        self.stream.write("\r" + line.ljust(self.last))
        self.stream.flush()
        self.last = len(line)
