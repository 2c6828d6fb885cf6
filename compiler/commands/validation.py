"""`memspec validate`: every estimate against the memory measured for the same setup.

Contract: `validate_records(paths)` reads measured records (JSON files whose `schema` is
`memspec/measured/v1`, found recursively), estimates each record's experiment and returns one
`Comparison` per record (those not in the checked-input cache made in forked processes when
there are enough of them, `processes.ordered`); `summarise` gives MAPE, median, worst and the count of
under-estimates (an OOM the estimate would have let through) per measure. Records whose
setup the estimator does not support yet are kept as `not estimated`, with the reason.
A GPU record that names its GPU also checks the verdict: a run that went out of memory
(`out_of_memory`; its figures are only what it reached, so they are left out of the errors)
must be answered "does not fit", and `verdicts` counts the misses both ways.
This module never imports the measuring code.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import Diagnostic, MemspecError
from ..measure.record import older_replay

RECORD_SCHEMA = "memspec/measured/v1"
MEASURES = ("allocated", "allocated_first_step", "reserved", "device")


@dataclass(frozen=True)
class Comparison:
    name: str
    file: str
    source: str
    measured: dict[str, int | None]
    estimated: dict[str, int] | None  # None: not estimated
    reason: str | None = None  # why not estimated
    out_of_memory: bool = False  # the measured run raised an OOM: its figures are lower bounds
    fits: bool | None = None  # the estimate's verdict on the record's GPU; None: no GPU named
    # the record's step ran bf16-mixed as torch.autocast on fp32 weights (precision_mode: autocast)
    autocast: bool = False
    # a traced record whose reserved was replayed before the GPU allocator histories' rules
    # (measure.record.older_replay): summarised apart on reserved until it is traced again
    older_replay: bool = False
    # a GPU record's margin: what a "fits" verdict keeps free for its kind of step
    # (specs/gpus.yaml device.margin_pct, as the estimate resolved it)
    margin: Any = None

    def error(self, measure: str) -> float | None:
        """Signed error in percent of the measurement; negative = under-estimate."""
        m = self.measured.get(measure)
        if self.estimated is None or not m or self.out_of_memory:
            return None
        return 100.0 * (self.estimated[measure] - m) / m


@dataclass(frozen=True)
class Summary:
    measure: str
    count: int
    mape: float
    median: float
    worst: float
    worst_name: str
    under: int


def record_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        candidates = sorted(p.rglob("*.json")) if p.is_dir() else [p]
        for f in candidates:
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError):
                if not p.is_dir():
                    raise MemspecError(Diagnostic("E101", str(f), 0, 0, "", "not a readable JSON record")) from None
                continue
            if isinstance(data, dict) and data.get("schema") == RECORD_SCHEMA:
                files.append(f)
    return files


def _base(model: str) -> Path:
    """The folder a record's `model:` is relative to: records name their model spec relative to
    the directory they were measured from (the repository root); the specs shipped with memspec
    stand in for a checkout."""
    from ..paths import data_root

    return Path.cwd() if (Path.cwd() / model).is_file() else data_root()


def record_report(path: Path, record: dict | None = None, replayed: bool = True):
    """The estimate of a measured record's experiment, without its layer table: (report, None),
    or (None, why not). `replayed=False` leaves out the caching allocator's replay (most of an
    estimate's time): the step's walk (its timeline, the tensors' peaks) is the same, and
    `reserved` and `allocated` (the allocator's blocks) are the tensors' peak, lower bounds."""
    from .. import api
    from ..pipeline.load import load_yaml_text
    from ..pipeline.validate import load_schema, validate

    import yaml

    record = json.loads(path.read_text()) if record is None else record
    experiment = dict(record["experiment"])
    experiment.setdefault("experiment", record.get("name", path.stem))
    # The estimate must assume the GPU the measurement ran on (or emulated): it decides the
    # cuBLAS workspaces. CPU traces emulate the catalog's default GPU unless they say which.
    if record.get("emulated_gpu"):
        experiment["gpu"] = record["emulated_gpu"]
    elif record.get("source") == "cpu-trace":
        experiment.pop("gpu", None)
    doc = load_yaml_text(yaml.safe_dump(experiment, sort_keys=False), str(path))
    problems = validate(doc, load_schema("experiment"))
    if problems:
        return None, "; ".join(d.message for d in problems)
    base = _base(experiment["model"])
    try:
        spec, setup = api.experiment_inputs(doc, base)
        # NB: a budget of 0 bytes is past every step's allocated peak: simulate leaves the replay out
        return api.run(spec, setup, table=False, verdict_budget=None if replayed else 0), None
    except MemspecError as exc:
        return None, exc.diagnostics[0].message


def compare(path: Path) -> Comparison:
    """The record's comparison, kept in the checked-input cache by the record's bytes and
    every file its estimate reads (`_name`): a rerun with nothing changed reads the answer
    back, an edit to a formula file makes anew the comparisons of the records whose specs
    reach it, and no other."""
    name, raw = _name(path, _Inputs.read())
    return _made((path, name, raw))


def _made(item: tuple[Path, str, bytes]) -> Comparison:
    """The comparison of a record under its key `name`: the kept one, or made and kept."""
    from .. import checked
    from ..pipeline.validate import check_loaded

    path, name, raw = item
    hit = checked.get(name)
    if isinstance(hit, Comparison):
        return hit
    # NB: a kept comparison's record conformed when it was made (its bytes are in the key)
    record = json.loads(raw)
    check_loaded(record, raw.decode("utf-8"), str(path), "record")
    found = _compare(path, record)
    checked.put(name, found)
    return found


# `type: name` in a formula or spec file: a child's or a module's layer type (a superset:
# an input's `type: int` is no formula file and drops out)
_TYPE = re.compile(rb"\btype:\s*[\"']?([a-z][a-z0-9_]*)")


@dataclass(frozen=True)
class _Inputs:
    """What every record's estimate reads (`shared`: the compiler and the schemas,
    `checked.code()`; the GPU catalog; the names of the formula files, as a layer type's
    presence decides what a spec reaches), and each formula file: layer type -> (a hash of its
    bytes, the layer types it names). Read once per `validate_records`."""

    shared: bytes
    formulas: dict[str, tuple[bytes, frozenset[str]]]  # layer type -> (a hash of its bytes, the types it names)

    @functools.cached_property
    def tree(self) -> bytes:
        """`checked.tree()`, which keys a record whose spec cannot be read; read once, when one is met."""
        from .. import checked

        return checked.tree()

    @classmethod
    def read(cls) -> "_Inputs":
        import hashlib

        from .. import checked
        from ..paths import formulas_dir, specs_dir

        formulas = {}
        for file in sorted(formulas_dir().glob("*.yaml")):
            raw = checked.read(file) or b"\1unreadable"
            formulas[file.stem] = hashlib.blake2b(raw, digest_size=20).digest(), frozenset(m.decode() for m in _TYPE.findall(raw))
        h = hashlib.blake2b(checked.code(), digest_size=20)
        h.update(checked.read(specs_dir() / "gpus.yaml") or b"\1unreadable")
        h.update("\0".join(formulas).encode())
        return cls(h.digest(), formulas)


def _reads(raw: bytes, inputs: _Inputs) -> list[bytes | str] | None:
    """The files the record's estimate reads beyond `inputs.shared`, each by name and content:
    its model spec (its bytes) and every formula file its layer types reach (a hash of its
    bytes; children and the
    substitutes `library.formula.SUBSTITUTES`, as `load_library` follows them; peft's
    modules_to_save), a superset where a `type:` names no layer. None when the spec cannot
    be read: the whole tree (`checked.tree()`) then keys the record."""
    from .. import checked
    from ..library.formula import SUBSTITUTES

    try:
        model = json.loads(raw)["experiment"]["model"]
        spec_path = (_base(model) / model).resolve()
    except (KeyError, TypeError, ValueError, OSError):
        return None
    spec = checked.read(spec_path)
    if spec is None:
        return None
    pending = [m.decode() for m in _TYPE.findall(spec)] + ["modules_to_save"]
    reached: set[str] = set()
    while pending:
        stem = pending.pop()
        if stem in reached or stem not in inputs.formulas:
            continue
        reached.add(stem)
        pending += [*inputs.formulas[stem][1], *SUBSTITUTES.get(stem, ())]
    parts: list[bytes | str] = [str(spec_path), spec]
    for stem in sorted(reached):
        parts += [stem, inputs.formulas[stem][0]]
    return parts


def _name(path: Path, inputs: _Inputs) -> tuple[str, bytes]:
    """The record's key in the cache, and its bytes."""
    import os

    from .. import checked

    raw = path.read_bytes()
    reads = _reads(raw, inputs)
    if reads is None:
        return checked.key("comparison", str(path), os.getcwd(), raw, inputs.tree), raw
    return checked.key("comparison", str(path), os.getcwd(), raw, inputs.shared, *reads), raw


def _compare(path: Path, record: dict) -> Comparison:
    measured = {m: record.get(m) for m in MEASURES}
    name = record.get("name", path.stem)
    oom = "out_of_memory" in record
    report, reason = record_report(path, record)
    autocast = (record.get("experiment") or {}).get("precision_mode") == "autocast"
    older = older_replay(record)
    if report is None:
        return Comparison(name, str(path), record.get("source", ""), measured, None, reason, oom, autocast=autocast, older_replay=older)
    # NB: a GPU's allocated is max_memory_allocated, the allocator's blocks (a remainder it
    # does not split counted with its block); a trace's is the traced tensors' bytes, each
    # rounded to 512 B, as the estimate's tensors at its peak
    e, gpu = report.estimate, record.get("source") == "gpu"
    estimated = {
        "allocated": report.allocated if gpu else e.peak.total,
        "allocated_first_step": e.allocated_first_step if gpu else e.first_step.total,
        "reserved": report.reserved,
        "device": report.device,
    }
    fits = None
    if gpu and report.gpu is not None:
        fits = report.fits
    margin = report.margin if gpu else None
    return Comparison(name, str(path), record.get("source", ""), measured, estimated, None, oom, fits, autocast, older, margin)


@dataclass(frozen=True)
class MarginCheck:
    """The GPU records of one kind of step against the catalog's margin for that kind."""

    margin: Any  # resolve.Margin
    count: int
    worst: tuple[float, str, str] | None  # (error %, record, measure) of the furthest under, None when none is under

    @property
    def covered(self) -> bool:
        return self.worst is None or -self.worst[0] <= self.margin.percent


def margin_checks(comparisons: list[Comparison]) -> list[MarginCheck]:
    """Per kind of step (specs/gpus.yaml device.margin_pct), the GPU records' furthest
    under-estimate of allocated, reserved or device: what the margin of a "fits" verdict must
    cover."""
    kinds: dict[str, list] = {}
    for c in comparisons:
        if c.margin is None or c.estimated is None or c.out_of_memory:
            continue
        entry = kinds.setdefault(c.margin.source, [c.margin, 0, None])
        entry[1] += 1
        for m in ("allocated", "reserved", "device"):
            error = c.error(m)
            if error is not None and error < 0 and (entry[2] is None or error < entry[2][0]):
                entry[2] = (error, c.name, m)
    return [MarginCheck(*kinds[k]) for k in sorted(kinds, key=lambda k: (len(k), k))]


@dataclass(frozen=True)
class Verdicts:
    count: int  # GPU records with a GPU named and an estimate
    missed: tuple[str, ...]  # ran out of memory, estimated "fits": the failure memspec exists to prevent
    false_alarms: tuple[str, ...]  # ran, estimated "does not fit"


def verdicts(comparisons: list[Comparison]) -> Verdicts | None:
    judged = [c for c in comparisons if c.fits is not None]
    if not judged:
        return None
    return Verdicts(
        len(judged), tuple(c.name for c in judged if c.out_of_memory and c.fits), tuple(c.name for c in judged if not c.out_of_memory and not c.fits)
    )


def validate_records(paths: list[Path], progress=None) -> list[Comparison]:
    """`progress(done, total, name)`, when given, is called before each record and once at the end."""
    from .. import checked
    from .processes import ordered

    files = record_files(paths)
    inputs = _Inputs.read() if files else None
    named = [(f, *_name(f, inputs)) for f in files]
    kept = [hit if isinstance(hit := checked.get(name), Comparison) else None for _, name, _ in named]
    made = ordered(_made, [item for item, hit in zip(named, kept) if hit is None])
    out = []
    for i, (f, hit) in enumerate(zip(files, kept)):
        if progress is not None:
            progress(i, len(files), f.stem)
        out.append(hit if hit is not None else next(made))
    if progress is not None:
        progress(len(files), len(files), "")
    return out


def summarise(comparisons: list[Comparison], measure: str) -> Summary | None:
    errors = [(c.error(measure), c.name) for c in comparisons]
    errors = [(e, n) for e, n in errors if e is not None]
    if not errors:
        return None
    absolute = [abs(e) for e, _ in errors]
    worst, worst_name = max(errors, key=lambda x: abs(x[0]))
    return Summary(measure, len(errors), statistics.fmean(absolute), statistics.median(absolute), worst, worst_name, sum(1 for e, _ in errors if e < 0))


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 30):.2f}"


def render(comparisons: list[Comparison]) -> str:
    width = max([len(c.name) for c in comparisons] + [6])
    lines = [f"{'record':<{width}}  {'measured GiB':>12}  {'estimated GiB':>13}  {'error %':>8}  {'first-step err %':>16}"]
    for c in comparisons:
        if c.estimated is None:
            lines.append(f"{c.name:<{width}}  {_gib(c.measured['allocated']):>12}  {'not estimated':>13}  ({c.reason})")
            continue
        if c.out_of_memory:
            said = {True: "estimated: fits (MISSED)", False: "estimated: does not fit", None: "no GPU named"}[c.fits]
            lines.append(f"{c.name:<{width}}  {'OOM':>12}  {_gib(c.estimated['allocated']):>13}  {'':>8}  ({said})")
            continue
        e, f = c.error("allocated"), c.error("allocated_first_step")
        lines.append(
            f"{c.name:<{width}}  {_gib(c.measured['allocated']):>12}  {_gib(c.estimated['allocated']):>13}  {e:>+8.2f}  {'-' if f is None else f'{f:+.2f}':>16}"
        )
    lines.append("")
    older = [c for c in comparisons if c.older_replay]
    for measure, label, rows in _summary_groups(comparisons, older):
        s = summarise(rows, measure)
        if s is None:
            continue
        lines.append(
            f"{label:<21} n={s.count:<4} MAPE {s.mape:.2f}%  median {s.median:.2f}%  worst {s.worst:+.2f}% ({s.worst_name})  under-estimates {s.under}"
        )
    v = verdicts(comparisons)
    if v is not None:
        lines.append(
            f"{'verdicts':<21} n={v.count:<4} missed OOMs {len(v.missed)}"
            + (f" ({', '.join(v.missed)})" if v.missed else "")
            + f"  false alarms {len(v.false_alarms)}"
            + (f" ({', '.join(v.false_alarms)})" if v.false_alarms else "")
        )
    checks = margin_checks(comparisons)
    if checks:
        lines += ["", "margins (specs/gpus.yaml device.margin_pct) against the GPU records' furthest under-estimate, by kind of step:"]
        for k in checks:
            worst = "none under" if k.worst is None else f"worst {k.worst[0]:+.2f}% ({k.worst[1]}, {k.worst[2]})"
            label = k.margin.source.removeprefix("specs/gpus.yaml device.margin_pct").lstrip(".") or "without checkpointing"
            lines.append(f"  {label:<22} margin {k.margin.text:<5} n={k.count:<4} {worst}{'' if k.covered else '  NOT COVERED'}")
    skipped = sum(1 for c in comparisons if c.estimated is None)
    if skipped:
        lines.append(f"not estimated: {skipped} record(s), kept until their setup is supported")
    return "\n".join(lines) + "\n"


def _summary_groups(comparisons: list[Comparison], older: list[Comparison]):
    """(measure, label, comparisons) per summary row: reserved apart for the records replayed
    before the GPU allocator histories' rules, when there are any."""
    for measure in MEASURES:
        if measure == "reserved" and older:
            yield measure, measure, [c for c in comparisons if not c.older_replay]
            yield measure, "reserved, old replay", older
        else:
            yield measure, measure, comparisons


def gate(
    comparisons: list[Comparison],
    max_mape: float | None,
    max_worst: float | None,
    max_under: int | None = None,
    measure: str = "allocated",
    under_tolerance: float = 0.0,
) -> list[str]:
    """Failures of the gate on `measure`, as sentences. `under_tolerance`: an estimate counts
    as under only when it is more than that many percent below the measurement."""
    s = summarise(comparisons, measure)
    out = []
    if s is None:
        asked = (max_mape, max_worst, max_under) != (None, None, None)
        return ["no record could be estimated"] if asked else []
    under = s.under if not under_tolerance else sum(1 for c in comparisons if (e := c.error(measure)) is not None and e < -under_tolerance)
    if max_under is not None and under > max_under:
        beyond = f" by more than {under_tolerance}%" if under_tolerance else ""
        out.append(f"{under} estimate(s) below the measurement{beyond} (at most {max_under} allowed)")
    if max_mape is not None and s.mape > max_mape:
        out.append(f"{measure} MAPE {s.mape:.2f}% exceeds {max_mape}%")
    if max_worst is not None and abs(s.worst) > max_worst:
        out.append(f"worst {measure} error {s.worst:+.2f}% ({s.worst_name}) exceeds {max_worst}%")
    return out


def as_data(comparisons: list[Comparison]) -> dict[str, Any]:
    return {
        "records": [
            {
                "name": c.name,
                "file": c.file,
                "measured": c.measured,
                "estimated": c.estimated,
                "reason": c.reason,
                "error_pct": {m: c.error(m) for m in MEASURES},
                "out_of_memory": c.out_of_memory,
                "fits": c.fits,
                "older_replay": c.older_replay,
            }
            for c in comparisons
        ],
        "summary": {m: (s.__dict__ if (s := summarise(comparisons, m)) else None) for m in MEASURES},
        "verdicts": (v.__dict__ if (v := verdicts(comparisons)) else None),
        "margins": [
            {
                "source": k.margin.source,
                "percent": float(k.margin.percent),
                "records": k.count,
                "worst": None if k.worst is None else {"error_pct": k.worst[0], "record": k.worst[1], "measure": k.worst[2]},
                "covered": k.covered,
            }
            for k in margin_checks(comparisons)
        ],
    }


def read_history(history_path: Path) -> list:
    """An allocator history (measure.history.read), or E921."""
    from ..measure import history

    try:
        return history.read(history_path)
    except (OSError, EOFError, ValueError, TypeError) as exc:
        raise MemspecError(
            Diagnostic(
                "E921",
                str(history_path),
                0,
                0,
                "--history",
                f"not an allocator history ({exc})",
                "a NAME.history.jsonl.gz that `memspec measure --memory-history` wrote",
            )
        ) from None


def history_comparison(events: list, history_name: str, record_path: Path, min_mib: float, comparison: Comparison, replays: list) -> dict:
    """The record's estimate beside the allocator history of its step (`events`, from
    read_history: a GPU's, or the tracer's for a traced record): the segments each side opened
    of `min_mib` or more, lined up by their requests' sizes (measure.history.compare), and those only one side has, in order, each
    with the estimate's last alike opening before it; E922 where the record has no estimate.
    `comparison` is validate's for the record and `replays` what its estimate gave the
    allocator (replay.recording_replays), empty where the comparison came from the cache,
    which keeps no replay: the record is then estimated here."""
    from dataclasses import asdict

    from ..measure import history
    from ..pipeline.replay import recording_replays
    from ..pipeline.walks.timeline import PROBE

    record = json.loads(record_path.read_text())
    if comparison.estimated is not None and not replays:
        with recording_replays() as replays:
            record_report(record_path, record)
    if comparison.estimated is None or not replays:
        raise MemspecError(
            Diagnostic(
                "E922",
                str(record_path),
                0,
                0,
                "$.experiment",
                f"no estimate to compare the history with: {comparison.reason or 'its estimate replays no allocator'}",
                "a record whose experiment estimates",
            )
        )
    # NB: one GPU's history; with several GPUs (a model split over them) the first GPU's
    # replays: its formulas' order and the other orders after it, up to the next GPU's
    first = [replays[0]] + list(itertools.takewhile(lambda r: r.order, replays[1:]))
    # NB: the order that reserved the most (the first of equals), whose figure the estimate's
    # reserved is; one pass over each side's sequence: that order's openings and step figures,
    # the GPU's openings and the model's reserved on them
    r = max(first, key=lambda r: (r.reserved, -r.order))
    est = history.replay_estimate(r.events, PROBE, r.alloc_conf, r.device_memory, r.step_starts)
    steps = {"gpu": [s.get("reserved") for s in record.get("steps") or []], "estimate": est.step_reserved}
    g = history.replay(events, r.alloc_conf)
    pairs = history.compare(g.openings, est.openings, int(min_mib * 2**20))
    only, last = [], None
    for a, b in pairs:
        if a and b:
            last = b
        else:
            # NB: a GPU history names no tensor unless it kept its frames: the estimate's alike
            # opening before it places it
            only.append({"side": "gpu" if a else "estimate", **asdict(a or b), "after": asdict(last) if a and last else None})
    return {
        "history": history_name,
        # NB: the history's side as the record names it: a traced record's is the tracer's
        # sequence (memspec measure --memory-history without --device); the keys stay "gpu"
        "measured_by": "GPU" if comparison.source == "gpu" else "trace",
        "gpu_reserved": g.gpu_reserved,
        "model_on_gpu_sequence_error_pct": g.error_pct,
        # NB: the model's peak of blocks on the history's requests, which is what a GPU's
        # max_memory_allocated reads (a trace's record counts tensors instead)
        "model_on_gpu_sequence_allocated": g.model_allocated,
        "record_allocated": record.get("allocated"),
        "out_of_memory": "out_of_memory" in record,
        "estimate_reserved": comparison.estimated["reserved"],
        "estimate_order": r.order,
        "min_mib": min_mib,
        "segments": {"gpu": sum(1 for a, _ in pairs if a), "estimate": sum(1 for _, b in pairs if b), "alike": sum(1 for a, b in pairs if a and b)},
        "step_reserved": steps,
        "only": only,
    }


def _steps(figures: list) -> str:
    return ", ".join("-" if f is None else f"{f / 2**30:.2f}" for f in figures) + " GiB" if figures else "-"


def render_history(c: dict) -> str:
    gib, mib = 2**30, 2**20
    seg = c["segments"]
    from ..pipeline.orders import ORDERS

    order = ORDERS[c["estimate_order"]].name
    side = c.get("measured_by", "GPU")
    lines = [
        f"{c['history']}: the {side} reserved {c['gpu_reserved'] / gib:.2f} GiB (the allocator model on its sequence "
        f"{c['model_on_gpu_sequence_error_pct']:+.2f} %), the estimate {c['estimate_reserved'] / gib:.2f} GiB "
        f"({order}, the largest of its orders); segments of "
        f"{c['min_mib']:g} MiB or more: the {side}'s {seg['gpu']}, the estimate's {seg['estimate']}, {seg['alike']} alike"
    ]
    blocks, record = c.get("model_on_gpu_sequence_allocated"), c.get("record_allocated")
    if side == "GPU" and blocks and record and not c.get("out_of_memory"):
        lines.append(
            f"  allocated: the GPU {record / gib:.2f} GiB (max_memory_allocated: blocks), the allocator model on its "
            f"requests {100 * (blocks - record) / record:+.2f} %"
        )
    steps = c["step_reserved"]
    if steps["gpu"] or steps["estimate"]:
        n, same = len(steps["estimate"]), len(steps["gpu"]) > len(steps["estimate"]) > 0
        repeat = f" (the replay stops after step {n}: step {n + 1} would begin from the cache step {n} began from)" if same else ""
        lines.append(f"  reserved by step: the {side} {_steps(steps['gpu'])}, the estimate {_steps(steps['estimate'])}{repeat}")
    for o in c["only"]:
        # NB: a history's own name carries its step where it has one (MemoryTracer.describe)
        named = f"{o['name']}, step {o['step']}" if o["step"] else o["name"]
        where = f"allocation {o['at']:,}" + (f" ({named})" if named else "")
        line = (
            f"  {side if o['side'] == 'gpu' else 'estimate'} only: {o['grew'] / mib:,.2f} MiB for a {o['request'] / mib:,.2f} MiB request at "
            f"{where}, the largest free block then {o['largest_free'] / mib:,.2f} MiB; allocated {o['allocated'] / gib:.2f} GiB, "
            f"reserved {o['reserved'] / gib:.2f} GiB after"
        )
        if o["after"]:
            a = o["after"]
            line += f"; after the estimate's allocation {a['at']:,} ({a['name']}, step {a['step']})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(args) -> int:
    from ..pipeline.replay import recording_replays
    from .progress import Progress

    history_path = getattr(args, "history", None)
    if history_path is not None and (len(args.paths) != 1 or not Path(args.paths[0]).is_file()):
        sys.stderr.write("validate: --history compares one record with the allocator history of its step: give one record file\n")
        return 1
    events = None if history_path is None else read_history(Path(history_path))
    # NB: with --history (one record) the estimate's replay is kept for the comparison with it
    with recording_replays() if events is not None else contextlib.nullcontext([]) as replays:
        comparisons = validate_records([Path(p) for p in args.paths], Progress(sys.stderr, "validate"))
    beside = None if events is None else history_comparison(events, Path(history_path).name, Path(args.paths[0]), args.min_mib, comparisons[0], replays)
    if args.format == "json":
        data = as_data(comparisons)
        if beside is not None:
            data["history"] = beside
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(render(comparisons) + ("" if beside is None else "\n" + render_history(beside)))
    failures = gate(comparisons, args.max_mape, args.max_worst, args.max_under)
    v = verdicts(comparisons)
    if v is not None and v.missed:
        failures.append(f"{len(v.missed)} run(s) went out of memory where the estimate says fits: {', '.join(v.missed)}")
    for f in failures:
        sys.stderr.write(f"validate: {f}\n")
    return 1 if failures else 0
