"""The pipeline end to end, for the CLI, notebooks and schedulers.

Contract: `load_spec(path)` loads and validates a model spec; `load_inputs(path, overrides)`
takes a model spec or an experiment file (the kind is read from its top-level keys) and
returns the resolved `Spec` and the admitted `Setup` (`admitted_setup`: resolve, then admit);
`estimate(path, **overrides)` runs every stage and returns a `Report`. For the HTML report, `step_timeline(report)` splits the simulated step into
its phases, `constants(report)` lists the named constants the estimate used and
`layer_types(report)` the formulas with their assumptions. Every user error is raised as one
`MemspecError` carrying all of its diagnostics. Nothing here prints.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from .errors import Diagnostic, MemspecError
from .pipeline.admit import admit
from .pipeline.evaluate import Node, Row, evaluate, image_tokens_per_sample, layer_table  # noqa: F401  (re-exported)
from .pipeline.expand import expand
from .library.formula import Library
from .library.shipped import library, spec_library  # noqa: F401  (re-exported)
from .pipeline.load import Document, load_yaml  # noqa: F401  (commands/diff.py reads api.load_yaml in every revision)
from .paths import display
from .pipeline.validate import checked_document
from .pipeline.resolve import (
    Constant,
    Setup,
    Spec,
    catalog_constants,
    checked_spec,
    deepspeed_constants,
    gpu_catalog,
    resolve_setup,
)
from .pipeline.render import Report  # noqa: F401  (re-exported: callers take the Report from api)
from .pipeline.simulate import ALLOCATOR_CONSTANTS, device_overhead, simulate


def _validated(path: str | Path, kind: str) -> Document:
    return checked_document(path, kind)


def file_kind(doc: Document) -> str:
    """spec, experiment, formula, gpus (the catalog), matrix (a measuring plan) or family (an
    import mapping), from the document's top-level keys."""
    data = doc.data if isinstance(doc.data, dict) else {}
    if "experiment" in data:
        return "experiment"
    if "layer_type" in data:
        return "formula"
    if "gpus" in data:
        return "gpus"
    if "matrix" in data:
        return "matrix"
    if "family" in data:
        return "family"
    return "spec"


def load_spec(path: str | Path) -> Spec:
    """A model spec file, loaded, validated and resolved: a frozen `resolve.Spec` (model name,
    modules in forward order with their layer type, inputs and checkpoint parameter count,
    image_tokens, hidden_size). Bad input raises `errors.MemspecError` with every diagnostic."""
    return checked_spec(path)


def load_inputs(path: str | Path, overrides: Mapping[str, Any] | None = None) -> tuple[Spec, Setup]:
    spec, doc = load_sources(path)
    return spec, admitted_setup(doc, spec, overrides)


def admitted_setup(doc: Document | None, spec: Spec, overrides: Mapping[str, Any] | None = None, formulas: Library | None = None) -> Setup:
    """Stages resolve -> admit: the experiment in `doc` (None for a bare spec) with `overrides`
    on top, resolved, and refused where the formulas (default: the shipped ones) do not
    model it. What every caller that estimates a setup takes."""
    return admit(doc, spec, resolve_setup(doc, spec, overrides), overrides, formulas)


def load_sources(path: str | Path) -> tuple[Spec, Document | None]:
    """The resolved model spec and the validated experiment document (None for a bare spec):
    what `admitted_setup(doc, spec, overrides)` needs, loaded once for many setups (sweeps)."""
    doc = checked_document(path, None)
    kind = file_kind(doc)
    if kind == "experiment":
        doc = _validated(path, "experiment")
        return experiment_spec(doc, Path(doc.file).parent), doc
    if kind != "spec":
        raise MemspecError(doc.diag("E208", "$", f"this is a {kind} file, not a model spec or an experiment"))
    return load_spec(path), None


def experiment_inputs(doc: Document, base: Path, overrides: Mapping[str, Any] | None = None) -> tuple[Spec, Setup]:
    """A validated experiment document whose `model:` is relative to `base`."""
    spec = experiment_spec(doc, base)
    return spec, admitted_setup(doc, spec, overrides)


def experiment_spec(doc: Document, base: Path) -> Spec:
    """The model spec a validated experiment document names, relative to `base`."""
    spec_path = base / doc.data["model"]
    if not spec_path.is_file():
        line, col = doc.where("$.model")
        raise MemspecError(
            Diagnostic(
                "E101",
                doc.file,
                line,
                col,
                "$.model",
                f"model spec '{doc.data['model']}' not found",
                f"looked for {spec_path.resolve()}; the path is relative to the experiment file",
            )
        )
    return load_spec(display(spec_path))


def layers(spec: Spec, setup: Setup, formulas: Library | None = None, reuse: dict | None = None) -> tuple[Node, ...]:
    """Stages expand -> evaluate: the evaluated layer tree, without the step's simulation
    (what the image tokens of a sample or a parameter count need). `reuse`: a dict kept
    across the runs of one spec and library, where each module's layers made before from the
    same inputs are taken again (expand.expand)."""
    lib = formulas or spec_library(spec)
    return evaluate(expand(spec, setup, lib, reuse), setup.optimizer, setup.state_bytes, setup.master_bytes, reuse)


def run(
    spec: Spec,
    setup: Setup,
    formulas: Library | None = None,
    table: bool = True,
    nodes: tuple[Node, ...] | None = None,
    reuse: dict | None = None,
    verdict_budget: int | None = None,
) -> Report:
    """Stages expand -> evaluate -> simulate on resolved inputs; `table=False` skips the
    layer table (searches that only need the peak); `nodes`, the layers of an earlier run of
    `spec` whose setup differs from this one only where expand and evaluate do not read it
    (the data-parallel degree), are simulated again as they are (a search's); `reuse`, as
    `layers`' (a search's or a sweep's: a sequence length changes the language model's
    layers, not the vision tower's); `verdict_budget`, a search's bytes for the device figure:
    a probe past it may get a lower bound instead of the figure (`estimate.reserved_bound`,
    see simulate)."""
    with _collector_paused():
        if nodes is None:
            nodes = layers(spec, setup, formulas, reuse)
            _reconcile(spec, nodes, setup)
        rows = layer_table(nodes) if table else ()
        est = simulate(nodes, setup, verdict_budget)
    _, consts = gpu_catalog()
    device = est.reserved + device_overhead(setup)
    # NB: a quantized linear's packed codes are not elements: its weight's own count (_elements)
    params = {n.inst.module: sum(_elements(x, setup) for x in n.walk()) for n in nodes}
    return Report(spec, setup, nodes, rows, est, est.allocated, est.reserved, device, consts, setup.gpu, params)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while an estimate runs, as it was after.

    NB: an estimate makes some hundred thousand objects that live until it ends (the step's
    events, the layer trees) and frees them by reference counting; the collector's passes over
    them found next to nothing and were a tenth of a search's time (LLaVA-1.5-7B fit, CPU: 110
    of 800 ms). What cycles an estimate leaves (the allocator replay's linked blocks) wait for
    the collector's next pass."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


QUANTIZED = ("linear_4bit", "linear_8bit")


def _elements(node: Node, setup: Setup) -> int:
    """A layer's parameter count: bytes over the weight dtype, or the weight's own count for a
    quantized linear (packed codes are not elements)."""
    if node.inst.formula.layer_type in QUANTIZED:
        s = node.inst.scope
        return s["d_in"] * s["d_out"] + (s["d_out"] if s["bias"] else 0)
    return node.cost.parameters // setup.bytes["param"]


def _reconcile(spec: Spec, nodes: tuple[Node, ...], setup: Setup) -> None:
    """The formulas' parameter count per module must equal the checkpoint's.

    NB: a tensor- or pipeline-parallel setup counts one rank's shard (and Megatron's padded
    vocabulary); the spec's own count is checked by every unsharded estimate of it."""
    if setup.tp > 1 or setup.pp > 1:
        return
    problems = []
    for n in nodes:
        m = spec.module(n.inst.module)
        # NB: LoRA adapters (a lora_linear's children after its base_layer) are not in the checkpoint
        adapters = {id(a) for x in n.walk() if x.inst.formula.layer_type in ("lora_linear", "dora_linear") for c in x.children[1:] for a in c.walk()}
        # NB: nor are the copies peft's modules_to_save makes (a wrapper's second child)
        adapters |= {id(a) for x in n.walk() if x.inst.formula.layer_type == "modules_to_save" for a in x.children[1].walk()}
        counted = sum(_elements(x, setup) for x in n.walk() if id(x) not in adapters)
        if counted != m.parameters:
            line, col = spec.doc.where(m.path + ".parameters")
            problems.append(
                Diagnostic(
                    "E502",
                    spec.file,
                    line,
                    col,
                    m.path + ".parameters",
                    f"the formulas count {counted:,} parameters for module '{m.name}', the spec says {m.parameters:,} (off by {counted - m.parameters:+,})",
                    "check the module's inputs against its config.json, or the count against the safetensors header",
                )
            )
    if problems:
        raise MemspecError(problems)


def estimate(path: str | Path, **overrides: Any) -> Report:
    """Estimate a spec or experiment file. Overrides use the experiment's keys:
    micro_batch, seq_len, images_per_sample, trainable, precision, optimizer,
    gradient_checkpointing, attention, dp, zero, gpu."""
    spec, setup = load_inputs(path, overrides)
    return run(spec, setup)


@dataclass(frozen=True)
class Segment:
    """A run of consecutive timeline events in one phase of the step."""

    phase: str  # forward | loss | backward | optimizer
    first: int  # index of its first event
    last: int  # index of its last event (inclusive)
    high: int  # the most bytes allocated during it


@dataclass(frozen=True)
class StepTimeline:
    """The steady-state step's allocated-bytes timeline, split into its phases."""

    events: tuple[tuple[str, str, int], ...]  # (simulator phase, layer, allocated), as `Estimate.timeline`
    segments: tuple[Segment, ...]  # forward, loss, backward, optimizer, in step order
    peak: int  # index of the event at the peak (the first at the maximum, as the simulator keeps it)
    loss: str | None  # the loss layer's path


def step_timeline(report: Report) -> StepTimeline:
    """The timeline with the loss told apart: the loss is the last layer of the forward
    (simulate.py, step 3), so its forward and backward events form the `loss` phase between
    the forward and the backward."""
    events = report.estimate.timeline
    leaves = [n for n in report.nodes[-1].walk() if not n.children] if report.nodes else []
    loss = leaves[-1].inst.path if leaves else None
    segments: list[Segment] = []
    for i, (phase, path, total) in enumerate(events):
        label = "loss" if path == loss and phase in ("forward", "backward") else phase
        if segments and segments[-1].phase == label:
            segments[-1] = Segment(label, segments[-1].first, i, max(segments[-1].high, total))
        else:
            segments.append(Segment(label, i, i, total))
    peak = next(i for i, e in enumerate(events) if e[2] == report.estimate.peak.total)
    return StepTimeline(events, tuple(segments), peak, loss)


def constants(report: Report) -> tuple[Constant, ...]:
    """The named constants the estimate used: the GPU catalog's (cuBLAS workspaces of the
    target architecture, CUDA context, NCCL when dp > 1), the caching allocator's, and the
    DeepSpeed buffer sizes under ZeRO."""
    s = report.setup
    return catalog_constants(s.target, s.dp) + ALLOCATOR_CONSTANTS + deepspeed_constants(s.deepspeed, s.zero)


def layer_types(report: Report) -> tuple:
    """The formulas the estimate evaluated, in order of first use (their summaries,
    assumptions and references are what the layer table assumes)."""
    seen: dict[str, object] = {}
    for root in report.nodes:
        for n in root.walk():
            seen.setdefault(n.inst.formula.layer_type, n.inst.formula)
    return tuple(seen.values())
