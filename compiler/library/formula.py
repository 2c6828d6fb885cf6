"""Formula files: the layer-type registry.

Contract: `load_library(folder)` reads every `<layer_type>.yaml` in the folder (the folder is
the only registry), validates each against `schemas/formula.schema.json`, compiles every
expression with Jinja2's sandbox and checks, before anything is evaluated, that each name an
expression uses is declared: an input, an earlier `let`, a context name or an allowed
function. It returns a frozen `Library`, or raises one `MemspecError` with every problem of
every file.

Expressions are integer arithmetic over named values. The grammar is Jinja2's expression
language cut down to what a formula needs: literals, names, `bytes.<dtype>`, arithmetic,
comparisons, `and`/`or`/`not`, `a if c else b` and the calls in `FUNCTIONS`. Anything else
(attribute access, subscripts, filters, tests) is refused at load time. A checked expression
is evaluated as a plain Python callable written from its checked AST (names read from the
scope, `bytes.<dtype>` a dict lookup, the allowed functions, no builtins); whatever raises
there is evaluated again in `ImmutableSandboxedEnvironment` with `StrictUndefined`, the
reference, so that values and errors are Jinja2's (tests/test_expr_python.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ..errors import Diagnostic, MemspecError, did_you_mean
from ..pipeline.load import Document, child_path, load_yaml, load_yaml_text
from ..paths import display
from .expr_python import FUNCTIONS, _callable
from .grammar import BYTES_KEYS, _env, analyse  # noqa: F401  (BYTES_KEYS, _env re-exported)

# Training setups beyond a plain step that a formula file may declare it models (its top-level
# `setups:` list). An estimate refuses a setup unless every formula its spec instantiates
# declares it (`admit._check_setups`); a file without the key models none of them.
SETUPS: Mapping[str, str] = {
    "packing": "packing: the micro-batch packed into one row, position_ids restarting per sequence",
    "activation_offloading": "activation offloading: saved activations kept in host memory (save_on_cpu)",
    "fused_linear_cross_entropy": "loss: fused_linear_cross_entropy (Liger): no full logits",
    "tensor_parallel": "Megatron tensor parallelism (tp > 1)",
    "sequence_parallel": "Megatron sequence parallelism (sp, with tp > 1)",
    "pipeline_parallel": "pipeline parallelism (pp > 1)",
    "autocast": "autocast: fp32 weights, the forward under torch.autocast (16-bit matmuls on per-forward weight copies, fp32 norms, softmax and loss)",
    "older_transformers": "transformers 4.43 to 4.48: the releases' own loss (versions.transformers)",
}

# Names every formula may use; `resolve` and `expand` provide their values per row.
CONTEXT_NAMES = frozenset(
    {
        "batch",  # samples in this module's stream (micro-batch x images for a vision tower)
        "seq",  # positions per sample in this module's stream
        "tokens",  # batch * seq
        "trainable",  # this row's parameters receive gradients
        "requires_grad",  # this row's parameters require grad, whether or not a gradient reaches them (a layer past the feature layer)
        "bias_trains",  # only this row's parameters named `bias` train, its weights stay frozen (peft bias='all' / 'lora_only')
        "grad_in",  # the row's input requires grad (something upstream is trainable)
        "grad_flows",  # trainable or grad_in: autograd records this row
        "bytes",  # element sizes, see BYTES_KEYS
        "attention",  # attention implementation: flash_attention_2 | sdpa | eager
        "cudnn_attention",  # the GPU's sdpa prefers cuDNN attention (sm90, sm100; pipeline/formula_context.py)
        "images",  # images per sample (and each video's temporal patches: vision_items)
        "videos",  # videos per sample
        "video_frames",  # frames per video (0 without videos)
        "micro_batch",  # samples per micro-batch
        "target_len",  # an encoder-decoder model's decoder positions per sample (0 for any other model)
        "image_h",  # input image height in pixels (native-resolution towers; 0 when none applies)
        "image_w",  # input image width in pixels
        "grid_rows",  # anyres tiling (LLaVA-NeXT): rows of tiles of the image's grid pinpoint; 0 without
        "grid_cols",  # anyres tiling: columns of tiles
        "checkpointing",  # the module's layers are gradient-checkpointing units
        "input_grads",  # enable_input_require_grads(): input embeddings' outputs require grad
        "fused_loss",  # the loss is a fused linear cross-entropy (Liger): no full logits
        "offloading",  # saved activations are offloaded to host memory (save_on_cpu)
        "autocast",  # the forward runs under torch.autocast on fp32 weights (bytes.act is its 16-bit dtype)
        "packed",  # the micro-batch is packed into one row (position_ids restart per sequence)
        "tp",  # Megatron tensor-parallel degree
        "sp",  # Megatron sequence parallelism (activations outside the tensor-parallel regions split by tp)
        "pp",  # pipeline stages; the estimate is for the first
        "transformers",  # the transformers release, major * 1_000_000 + minor * 1_000 + patch (4.46.3: 4_046_003)
    }
)
FACTOR_NAMES = ("gradients", "optimizer_states")


# --------------------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Expr:
    """A checked expression with the place it came from (for errors at evaluation).

    NB: checked at load (grammar, declared names), compiled by Jinja2 at its first
    evaluation: most of the library's expressions are never evaluated for a given model, and
    compiling them all would be most of the start-up time."""

    source: str
    file: str
    path: str
    line: int
    col: int
    names: frozenset[str]
    compiled: bool = False  # a Jinja2 expression (else `constant`)
    constant: Any = None
    # the same expression as Python source over a scope `s` (see `_python`); None: Jinja2 only
    python: str | None = field(default=None, compare=False, repr=False)

    def __call__(self, scope: Mapping[str, Any]) -> Any:
        if not self.compiled:
            return self.constant
        if self.python is not None:
            try:
                return _callable(self.python)(scope)
            except Exception:  # NB: Jinja2 says what went wrong, in the words users know
                pass
        return self.jinja(scope)

    def jinja(self, scope: Mapping[str, Any]) -> Any:
        """The value as Jinja2's sandbox computes it: the reference `__call__` agrees with."""
        try:
            return _jinja(self.source)(**scope)
        except MemspecError:
            raise
        except Exception as exc:  # NB: arithmetic on user data: division by zero, type mix-ups
            raise MemspecError(self.diag("E404", f"cannot evaluate '{self.source}': {exc}")) from None

    def diag(self, code: str, message: str, help: str | None = None) -> Diagnostic:
        return Diagnostic(code, self.file, self.line, self.col, self.path, message, help)


def compile_expr(value: Any, doc: Document, path: str, declared: frozenset[str], problems: list[Diagnostic]) -> Expr:
    """Compile one expression found at `path` of `doc`; problems are appended, not raised."""
    line, col = doc.where(path)
    if isinstance(value, (bool, int)):
        return Expr(str(value), doc.file, path, line, col, frozenset(), constant=value)
    source = str(value)
    names, python, refused, reason = analyse(source)
    if refused is not None:
        problems.append(doc.diag("E403", path, f"'{source}': {refused}", "formulas are integer arithmetic over declared names"))
        return Expr(source, doc.file, path, line, col, frozenset(), constant=0)
    if reason is not None:
        problems.append(doc.diag("E402", path, f"cannot parse '{source}': {reason}"))
        return Expr(source, doc.file, path, line, col, frozenset(), constant=0)
    for name in sorted(names - declared - set(FUNCTIONS)):
        hint = did_you_mean(name, declared)
        problems.append(doc.diag("E401", path, f"undeclared name '{name}' in '{source}'", hint or "declare it under inputs: or let:"))
    return Expr(source, doc.file, path, line, col, names, compiled=True, python=python)


@lru_cache(maxsize=None)
def _jinja(source: str) -> Callable[..., Any]:
    """The sandboxed compiled expression, once per distinct source text."""
    return _env().compile_expression(source, undefined_to_none=False)


# --------------------------------------------------------------------------- formulas


@dataclass(frozen=True)
class Input:
    name: str
    type: str  # int | bool | str | tensor
    default: Any = None
    has_default: bool = False
    min: int | None = None
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Saved:
    """A tensor kept for backward, by name so that several consumers charge it once."""

    tensor: str  # a local name, or "{input}" naming a tensor-typed input
    bytes: Expr
    # backward: freed by its charger's backward; forward: when the forward ends; gradient: it
    # becomes the layer's parameter gradient in backward (freed as the gradient appears);
    # step: held by the training loop until the whole backward has run (the loss); cached: as
    # backward, and held until the forward ends where a checkpointing unit keeps nothing
    # (autocast's cast cache holds a trainable weight's 16-bit copy for the whole forward)
    until: str = "backward"


@dataclass(frozen=True)
class Allocation:
    """One entry of a layer's allocation order (the caching allocator's replay): `op` alloc
    (a transient tensor `name` of `bytes`), output (an alloc that is the layer's result, which
    the orders that hand results on give its reader), free (the alloc of that name), grad (the alloc of
    that name becomes the layer's shared gradient, State._regrad), or saved (the layer's
    activation `name`: allocated here in forward, freed here in backward)."""

    op: str
    name: str
    bytes: Expr | None = None


@dataclass(frozen=True)
class Child:
    name: str
    type: str
    count: Expr | None
    inputs: Mapping[str, Expr]  # tensor-typed inputs hold the tensor name in Expr.constant
    context: Mapping[str, Expr]
    grad_in: Expr | None
    reaches_loss: Expr | None
    checkpoint_unit: bool
    path: str
    frozen: Expr | None = None  # true: its parameters never train, whatever its module does
    when: Expr | None = None  # false: the child is not built (no index in its path, unlike count 0)
    output: str | None = None  # the local tensor name it returns, where a later sibling reads it


@dataclass(frozen=True)
class Example:
    name: str
    inputs: Mapping[str, Any]
    context: Mapping[str, Any]
    expect: Mapping[str, int]
    path: str


@dataclass(frozen=True)
class Formula:
    layer_type: str
    file: str
    summary: str
    inputs: tuple[Input, ...]
    lets: tuple[tuple[str, Expr], ...]
    factors: Mapping[str, Expr]  # gradients, optimizer_states
    param_tensors: tuple[Expr, ...]  # bytes of each parameter tensor
    param_shapes: tuple[tuple[Expr, ...] | None, ...]  # each one's shape, where the file gives it
    param_names: tuple[str, ...]  # each one's attribute name in its module (weight unless the file says)
    module_class: str | None  # the torch class the layer is, where a rule depends on it
    buffers: tuple[Expr, ...]  # bytes of each buffer tensor
    activations: tuple[Saved, ...]
    transient: Mapping[str, Expr]
    checkpoint: tuple[Saved, ...]
    children: tuple[Child, ...]
    assumptions: tuple[str, ...]
    references: tuple[str, ...]
    examples: tuple[Example, ...]
    doc: Document = field(compare=False, repr=False)
    # dim 0 of each parameter tensor, where a formula says (FSDP2 shards and pads dim 0)
    param_rows: tuple[Expr, ...] = ()
    # the training setups (SETUPS) this file's figures model, beyond a plain step
    setups: frozenset[str] = frozenset()
    # phase -> the order its own transient tensors are allocated and freed in (replay only)
    allocations: Mapping[str, tuple[Allocation, ...]] = field(default_factory=dict)
    # its forward and backward run cuBLAS GEMMs: a thread's first GEMM makes the thread's
    # cuBLAS and cuBLASLt workspaces (the replay places them there)
    gemm: bool = False
    # the names of its tensor-typed inputs (expand asks for every child input of every instance)
    tensor_inputs: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @property
    def is_composite(self) -> bool:
        return bool(self.children)

    def input(self, name: str) -> Input | None:
        return next((i for i in self.inputs if i.name == name), None)


@dataclass(frozen=True)
class Library:
    formulas: Mapping[str, Formula]
    folder: str
    known: frozenset[str] = frozenset()  # every layer type in the folder, loaded or not

    def __getitem__(self, layer_type: str) -> Formula:
        return self.formulas[layer_type]

    def __contains__(self, layer_type: str) -> bool:
        return layer_type in self.formulas


def _tensor_ref(template: str, formula_inputs: Mapping[str, Input]) -> str | None:
    """The tensor input a "{name}" template refers to, or None for a local name."""
    if template.startswith("{") and template.endswith("}"):
        return template[1:-1]
    return None


def _compile_saved(entries, doc, base, declared, inputs, problems) -> tuple[Saved, ...]:
    out = []
    for i, entry in enumerate(entries or ()):
        path = child_path(base, i)
        tensor = entry["tensor"]
        ref = _tensor_ref(tensor, inputs)
        if ref is not None and (ref not in inputs or inputs[ref].type != "tensor"):
            tensors = [k for k, v in inputs.items() if v.type == "tensor"]
            problems.append(
                doc.diag(
                    "E401",
                    child_path(path, "tensor"),
                    f"'{tensor}' names no tensor input",
                    did_you_mean(ref, tensors) or f"tensor inputs: {', '.join(tensors) or 'none'}",
                )
            )
        out.append(Saved(tensor, compile_expr(entry["bytes"], doc, child_path(path, "bytes"), declared, problems), entry.get("until", "backward")))
    return tuple(out)


def _compile_allocations(data, doc, scope, activations, problems) -> dict[str, tuple[Allocation, ...]]:
    """Each phase's allocation order; a free or a grad names an alloc above it (a forward's free
    may also name a saved entry above it: where the layer does not keep that tensor, a
    checkpointing unit's first forward, it dies there), a saved entry one of the layer's
    activations (E401 otherwise)."""
    saved = [s.tensor for s in activations]
    out = {}
    for phase, entries in data.items():
        order, made, unkept, named = [], [], [], []
        for i, entry in enumerate(entries):
            path = child_path(child_path("$.allocations", phase), i)
            if "alloc" in entry:
                made.append(entry["alloc"])
                op = "output" if entry.get("output") else "alloc"
                order.append(Allocation(op, entry["alloc"], compile_expr(entry["bytes"], doc, child_path(path, "bytes"), scope, problems)))
            elif "free" in entry or "grad" in entry:
                op = "free" if "free" in entry else "grad"
                if entry[op] not in made and (op == "grad" or entry[op] not in unkept):
                    hint = did_you_mean(entry[op], made + unkept) or f"allocated above: {', '.join(made + unkept) or 'nothing'}"
                    if op == "free" and entry[op] in named:
                        hint = f"a backward frees a saved tensor at its `saved` entry; {hint}"
                    problems.append(
                        doc.diag(
                            "E401",
                            child_path(path, op),
                            f"'{entry[op]}' is {'freed' if op == 'free' else 'made the gradient'} before any alloc of that name",
                            hint,
                        )
                    )
                order.append(Allocation(op, entry[op]))
            else:
                if entry["saved"] not in saved:
                    problems.append(
                        doc.diag(
                            "E401",
                            child_path(path, "saved"),
                            f"'{entry['saved']}' is none of the layer's activations",
                            did_you_mean(entry["saved"], saved) or f"activations: {', '.join(saved) or 'none'}",
                        )
                    )
                (unkept if phase == "forward" else named).append(entry["saved"])
                order.append(Allocation("saved", entry["saved"]))
        out[phase] = tuple(order)
    return out


def _compile_gemm(data: Mapping[str, Any], composite: bool, doc: Document, problems: list[Diagnostic]) -> bool:
    """`gemm:`, a leaf's: the replay places a thread's workspaces after a leaf's GEMM, so on a
    composite it would mean nothing."""
    if data.get("gemm") and composite:
        problems.append(
            doc.diag(
                "E208",
                "$.gemm",
                "gemm on a composite layer type: the replay places a thread's workspaces at a leaf's GEMM",
                "mark the leaf layer types that run the GEMMs (linear) and leave gemm out here",
            )
        )
    return bool(data.get("gemm", False))


def _compile_formula(doc: Document, problems: list[Diagnostic]) -> Formula:
    data = doc.data
    stem = Path(doc.file).stem
    if data["layer_type"] != stem:
        problems.append(
            doc.diag(
                "E302",
                "$.layer_type",
                f"layer_type '{data['layer_type']}' differs from the file name '{stem}'",
                "the file stem is the layer type: rename one of them",
            )
        )
    inputs = {
        name: Input(name, spec["type"], spec.get("default"), "default" in spec, spec.get("min"), tuple(spec.get("choices", ())))
        for name, spec in (data.get("inputs") or {}).items()
    }
    lets, scope = _compile_lets(data.get("let") or {}, inputs, doc, problems)
    raw_factors = data.get("factors") or {}
    factors = {
        name: compile_expr(value, doc, child_path("$.factors", name), scope, problems)
        for name, value in raw_factors.items()
        if name not in ("parameters", "buffers", "parameter_rows")
    }
    # Parameters and buffers may be listed one tensor each: the allocator rounds every
    # tensor on its own.
    param_tensors, param_shapes, param_names = _compile_parameters(raw_factors.get("parameters"), doc, scope, problems)
    buffers = _compile_tensor_list(raw_factors.get("buffers"), doc, "buffers", scope, problems)
    param_rows = _compile_tensor_list(raw_factors.get("parameter_rows"), doc, "parameter_rows", scope, problems)
    if param_rows and len(param_rows) != len(param_tensors):
        problems.append(
            doc.diag(
                "E208",
                "$.factors.parameter_rows",
                f"{len(param_rows)} rows for {len(param_tensors)} parameter tensors",
                "give dim 0 of every tensor listed under parameters, in the same order",
            )
        )
    transient = {name: compile_expr(value, doc, child_path("$.transient", name), scope, problems) for name, value in (data.get("transient") or {}).items()}
    activations = _compile_saved(data.get("activations"), doc, "$.activations", scope, inputs, problems)
    checkpoint = _compile_saved((data.get("checkpoint") or {}).get("saves"), doc, "$.checkpoint.saves", scope, inputs, problems)
    children = _compile_children(data.get("children") or (), doc, scope, problems)
    allocations = _compile_allocations(data.get("allocations") or {}, doc, scope, activations, problems)
    examples = tuple(
        Example(e["name"], e.get("inputs") or {}, e.get("context") or {}, e["expect"], child_path("$.examples", i))
        for i, e in enumerate(data.get("examples") or ())
    )
    return Formula(
        layer_type=data["layer_type"],
        file=doc.file,
        summary=data["summary"],
        inputs=tuple(inputs.values()),
        lets=tuple(lets),
        factors=factors,
        param_tensors=param_tensors,
        param_rows=param_rows,
        param_shapes=param_shapes,
        param_names=param_names,
        module_class=data.get("module_class"),
        gemm=_compile_gemm(data, bool(children), doc, problems),
        buffers=buffers,
        activations=activations,
        transient=transient,
        checkpoint=checkpoint,
        children=children,
        assumptions=tuple(data.get("assumptions") or ()),
        references=tuple(data.get("references") or ()),
        examples=examples,
        doc=doc,
        setups=frozenset(data.get("setups") or ()),
        allocations=allocations,
        tensor_inputs=frozenset(i.name for i in inputs.values() if i.type == "tensor"),
    )


def _compile_lets(raw: Mapping[str, Any], inputs: Mapping[str, Input], doc: Document, problems) -> tuple[list, frozenset[str]]:
    """The `let` names in order, each compiled over the context, the inputs and the lets
    before it; and every name the rest of the file may use."""
    declared = set(CONTEXT_NAMES) | {n for n, i in inputs.items() if i.type != "tensor"}
    lets = []
    for name, value in raw.items():
        path = child_path("$.let", name)
        if name in declared:
            problems.append(doc.diag("E405", path, f"'{name}' shadows an input or context name", "pick another name"))
        lets.append((name, compile_expr(value, doc, path, frozenset(declared), problems)))
        declared.add(name)
    return lets, frozenset(declared)


def _compile_children(raw, doc: Document, scope: frozenset[str], problems) -> tuple:
    children = tuple(_compile_child(c, doc, child_path("$.children", i), scope, problems) for i, c in enumerate(raw))
    names = [c.name for c in children]
    for i, c in enumerate(children):
        if c.name in names[:i]:
            problems.append(doc.diag("E103", c.path, f"duplicate child name '{c.name}'"))
        if c.output is not None and not any(c.output in (e.constant for e in s.inputs.values()) for s in children[i + 2 :]):
            problems.append(
                doc.diag(
                    "E401",
                    child_path(c.path, "output"),
                    f"output '{c.output}' of child '{c.name}' is read by no sibling after the next one",
                    "name the tensor a later sibling takes as an input (the next sibling's input needs no name: it reads the output as it is made)",
                )
            )
    return children


def _compile_parameters(raw, doc: Document, scope: frozenset[str], problems) -> tuple[tuple[Expr, ...], tuple, tuple[str, ...]]:
    """Parameter tensors: a bytes expression each, or `{shape: [dims], name: n}` (elements in
    the weight dtype: prod(dims) * bytes.param), which also tells shape-aware optimizers
    (Adafactor's factored second moments) the tensor's dims, and the Trainer's parameter
    groups its name (default `weight`)."""
    path = child_path("$.factors", "parameters")
    if not isinstance(raw, list):
        single = raw is not None
        return _compile_tensor_list(raw, doc, "parameters", scope, problems), ((None,) if single else ()), (("weight",) if single else ())
    tensors, shapes, names = [], [], []
    for i, entry in enumerate(raw):
        at = child_path(path, i)
        if isinstance(entry, dict):
            dims = entry["shape"]
            shapes.append(tuple(compile_expr(d, doc, child_path(child_path(at, "shape"), j), scope, problems) for j, d in enumerate(dims)))
            text = " * ".join(f"({d})" for d in dims) + " * bytes.param"
            tensors.append(compile_expr(text, doc, child_path(at, "shape"), scope, problems))
            names.append(entry.get("name", "weight"))
        else:
            shapes.append(None)
            tensors.append(compile_expr(entry, doc, at, scope, problems))
            names.append("weight")
    return tuple(tensors), tuple(shapes), tuple(names)


def _compile_tensor_list(raw, doc: Document, name: str, scope: frozenset[str], problems) -> tuple[Expr, ...]:
    path = child_path("$.factors", name)
    if isinstance(raw, list):
        return tuple(compile_expr(v, doc, child_path(path, i), scope, problems) for i, v in enumerate(raw))
    if raw is not None:
        return (compile_expr(raw, doc, path, scope, problems),)
    return ()


def _compile_child(entry, doc: Document, path: str, scope: frozenset[str], problems) -> Child:
    def expr(key, value, extra=frozenset()):
        return compile_expr(value, doc, child_path(path, key), scope | extra, problems)

    inputs = {}
    for key, value in (entry.get("inputs") or {}).items():
        # Tensor-typed inputs are names, not expressions; which ones are tensors is known
        # only once every file is loaded, so both readings are kept until _link.
        ipath = child_path(child_path(path, "inputs"), key)
        line, col = doc.where(ipath)
        inputs[key] = Expr(str(value), doc.file, ipath, line, col, frozenset(), constant=value)
    return Child(
        name=entry["name"],
        type=entry["type"],
        count=expr("count", entry["count"]) if "count" in entry else None,
        inputs=inputs,
        context={k: compile_expr(v, doc, child_path(child_path(path, "context"), k), scope, problems) for k, v in (entry.get("context") or {}).items()},
        grad_in=expr("grad_in", entry["grad_in"], frozenset({"previous", "upstream"})) if "grad_in" in entry else None,
        reaches_loss=expr("reaches_loss", entry["reaches_loss"]) if "reaches_loss" in entry else None,
        checkpoint_unit=bool(entry.get("checkpoint_unit", False)),
        path=path,
        frozen=expr("frozen", entry["frozen"]) if "frozen" in entry else None,
        when=expr("when", entry["when"]) if "when" in entry else None,
        output=entry.get("output"),
    )


def _link(formulas: dict[str, Formula], problems: list[Diagnostic], broken: frozenset[str] = frozenset()) -> dict[str, Formula]:
    """Second pass, once every file is known: child types, child inputs, cycles. A child
    whose type's file exists but failed to load (`broken`) is not reported again: that
    file's own errors are the cause."""
    linked = {}
    for name, f in formulas.items():
        children = []
        for c in f.children:
            if c.type in broken:
                children.append(c)
                continue
            if c.type not in formulas:
                problems.append(
                    f.doc.diag(
                        "E301",
                        child_path(c.path, "type"),
                        f"unknown layer type '{c.type}'",
                        did_you_mean(c.type, formulas) or "layer types are the file stems in formulas/",
                    )
                )
                children.append(c)
                continue
            children.append(_link_child(f, c, formulas[c.type], problems))
        linked[name] = Formula(**{**f.__dict__, "children": tuple(children)})
    reported: set[frozenset[str]] = set()
    for name in linked:
        cycle = _find_cycle(name, linked, ())
        if cycle and cycle[0] == name and frozenset(cycle) not in reported:
            # NB: one error per cycle, at the child entry of its first file that starts it
            reported.add(frozenset(cycle))
            f = linked[name]
            child = next(c for c in f.children if c.type == cycle[1])
            problems.append(
                f.doc.diag("E303", child_path(child.path, "type"), f"circular composite: {' -> '.join(cycle)}", "a layer type cannot contain itself")
            )
    return linked


def _link_child(parent: Formula, c: Child, target: Formula, problems) -> Child:
    scope = frozenset(CONTEXT_NAMES | {i.name for i in parent.inputs if i.type != "tensor"} | {n for n, _ in parent.lets})
    parent_tensors = {i.name for i in parent.inputs if i.type == "tensor"}
    inputs = {}
    for key, raw in c.inputs.items():
        decl = target.input(key)
        if decl is None:
            problems.append(
                Diagnostic(
                    "E203",
                    raw.file,
                    raw.line,
                    raw.col,
                    raw.path,
                    f"'{target.layer_type}' has no input '{key}'",
                    did_you_mean(key, [i.name for i in target.inputs]) or f"its inputs: {', '.join(i.name for i in target.inputs)}",
                )
            )
            continue
        if decl.type == "tensor":
            ref = _tensor_ref(str(raw.constant), {})
            if ref is not None and ref not in parent_tensors:
                problems.append(
                    Diagnostic(
                        "E401",
                        raw.file,
                        raw.line,
                        raw.col,
                        raw.path,
                        f"'{raw.constant}' names no tensor input of '{parent.layer_type}'",
                        did_you_mean(ref, parent_tensors) or "use a plain name for a tensor local to this composite",
                    )
                )
            inputs[key] = raw
        else:
            inputs[key] = compile_expr(raw.constant, parent.doc, raw.path, scope, problems)
    for decl in target.inputs:
        if not decl.has_default and decl.name not in inputs:
            problems.append(parent.doc.diag("E201", child_path(c.path, "inputs"), f"missing input '{decl.name}' of '{target.layer_type}'"))
    return Child(**{**c.__dict__, "inputs": inputs})


def _find_cycle(name: str, formulas: Mapping[str, Formula], stack: tuple[str, ...]) -> tuple[str, ...] | None:
    if name in stack:
        return stack[stack.index(name) :] + (name,)
    f = formulas.get(name)
    if f is None:
        return None
    for c in f.children:
        found = _find_cycle(c.type, formulas, stack + (name,))
        if found:
            return found
    return None


# NB: expand swaps these in for a `linear` child (LoRA, DoRA, bitsandbytes quantization), so a
# library loaded for some layer types holds them whenever it holds `linear`
SUBSTITUTES: Mapping[str, tuple[str, ...]] = {"linear": ("lora_linear", "dora_linear", "linear_4bit", "linear_8bit")}


def load_library(folder: str | Path, types: Iterable[str] | None = None) -> Library:
    """The formula files in `folder`, compiled and linked; all problems raised at once.

    With `types`, only those layer types and what they reach (children, SUBSTITUTES) are
    loaded: an estimate reads the files its spec uses, not the whole folder. `memspec check`
    loads everything."""
    from .. import checked

    by_stem = {p.stem: p for p in sorted(Path(folder).glob("*.yaml"))}
    return checked.library(folder, by_stem.values(), types, lambda: _load_library(folder, types, by_stem), Library)


# (file as messages name it, its bytes, the schema's id) -> the formula compiled from them,
# where they had no problems
_COMPILED: dict[tuple[str, bytes, int], Formula] = {}


def _checked_formula(file: str, schema, validate) -> Formula:
    """One formula file loaded, validated and compiled (unlinked), or its problems raised;
    kept in this process by its bytes, which libraries of different layer types share.
    NB: load_schema keeps each schema it reads for the process, so its id names it."""
    try:
        raw = Path(file).resolve().read_bytes()
        text = raw.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError):
        raw = None  # NB: load_yaml says what is wrong
    hit = _COMPILED.get((file, raw, id(schema))) if raw is not None else None
    if hit is not None:
        return hit
    doc = load_yaml(file) if raw is None else load_yaml_text(text, file)
    problems = validate(doc, schema)
    if problems:
        raise MemspecError(problems)
    formula = _compile_formula(doc, problems)
    if problems:
        raise MemspecError(problems)
    if raw is not None:
        _COMPILED[(file, raw, id(schema))] = formula
    return formula


def _load_library(folder: str | Path, types: Iterable[str] | None, by_stem: Mapping[str, Path]) -> Library:
    from ..pipeline.validate import load_schema, validate

    schema = load_schema("formula")
    problems: list[Diagnostic] = []
    formulas: dict[str, Formula] = {}
    broken: set[str] = set()
    pending = sorted(by_stem) if types is None else sorted(set(types))
    while pending:
        stem = pending.pop()
        if stem in formulas or stem in broken or stem not in by_stem:
            continue
        try:
            formula = formulas[stem] = _checked_formula(display(by_stem[stem]), schema, validate)
        except MemspecError as exc:
            problems.extend(exc.diagnostics)
            broken.add(stem)
            continue
        if types is not None:
            pending.extend(c.type for c in formula.children)
            pending.extend(SUBSTITUTES.get(stem, ()))
    formulas = _link(dict(sorted(formulas.items())), problems, frozenset(broken))
    if problems:
        raise MemspecError(problems)
    return Library(formulas, str(folder), frozenset(by_stem))


# --------------------------------------------------------------------------- binding

Locate = Callable[[str, str, "str | None"], Diagnostic]


def bind(formula: Formula, given: Mapping[str, Any], context: Mapping[str, Any], locate: Locate) -> dict[str, Any]:
    """The scope a formula's expressions run in: context, inputs (checked, defaults filled)
    and its `let` values in order. `locate(key, message, help)` places an error on input `key`.
    Tensor-typed inputs are not part of the scope (they are names, resolved by `expand`)."""
    problems: list[Diagnostic] = []
    known = {i.name for i in formula.inputs}
    for key in given:
        if key not in known:
            problems.append(locate(key, f"'{formula.layer_type}' has no input '{key}'", did_you_mean(key, known) or f"its inputs: {', '.join(sorted(known))}"))
    scope = dict(context)
    for decl in formula.inputs:
        if decl.type == "tensor":
            continue
        if decl.name in given:
            value = given[decl.name]
        elif decl.has_default:
            value = decl.default
        else:
            problems.append(locate(decl.name, f"missing input '{decl.name}' of '{formula.layer_type}'", None))
            continue
        problem = _check_value(decl, value)
        if problem:
            problems.append(locate(decl.name, f"input '{decl.name}' of '{formula.layer_type}' {problem}", None))
        scope[decl.name] = value
    if problems:
        raise MemspecError(problems)
    for name, expr in formula.lets:
        scope[name] = expr(scope)
    return scope


def _check_value(decl: Input, value: Any) -> str | None:
    if decl.type == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            return f"must be an integer, got {value!r}"
        if decl.min is not None and value < decl.min:
            return f"must be >= {decl.min}, got {value}"
    elif decl.type == "bool" and not isinstance(value, bool):
        return f"must be true or false, got {value!r}"
    elif decl.type == "str":
        if not isinstance(value, str):
            return f"must be a string, got {value!r}"
        if decl.choices and value not in decl.choices:
            hint = did_you_mean(value, decl.choices)
            return f"must be one of {', '.join(decl.choices)}, got '{value}'" + (f" ({hint})" if hint else "")
    return None


# The most copies of one child a layer table holds: the deepest published transformer has 1,000
# layers (DeepNet, Wang et al. 2022), the deepest released checkpoint 126 (Llama-3.1-405B); a
# larger count is a mistyped size, which would take minutes and gigabytes to expand.
MAX_COPIES = 1024


def copies(expr: Expr, value: Any, child: str) -> int:
    """A composite child's count: an integer, at most MAX_COPIES."""
    count = integer(expr, value)
    if count > MAX_COPIES:
        message = f"'{expr.source}' gave {count:,} copies of '{child}', more than the {MAX_COPIES:,} memspec expands"
        help = "no published model has that many layers: check the input that sets the count (on import, config.json's num_hidden_layers)"
        raise MemspecError(expr.diag("E406", message, help))
    return count


def integer(expr: Expr, value: Any) -> int:
    """A factor's value, which must be an integer number of bytes."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MemspecError(
            expr.diag("E404", f"'{expr.source}' gave {value!r}, not an integer", "sizes and counts are integers: use // for division, ceil_div() to round up")
        )
    if value < 0:
        raise MemspecError(expr.diag("E404", f"'{expr.source}' gave {value}, a negative size"))
    return value
