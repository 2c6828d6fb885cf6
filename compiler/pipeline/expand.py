"""Stage 4, expand: a resolved spec and setup become the tree of layer instances.

Contract: `expand(spec, setup, library)` returns a frozen `Instance` tree, one root per
module in forward order, every composite unrolled into its children (a child with count N
becomes N instances; count 0 drops it). Each instance carries the scope its formula is
evaluated in (context + inputs + lets), the concrete names of the tensors it reads, and
its grad-flow flags, computed in forward order:

- `trainable`: the module is in the setup's trainable set and the instance's output reaches
  the loss (a layer whose output nothing reads gets no gradient; with a mixed-precision
  optimizer it still gets fp32 master weights and states: `flat_states`);
- `grad_in`: the instance's input requires grad; by default the previous sibling's output
  (the parent's input for a first child), or a child's own `grad_in:` expression;
- `grad_flows`: `trainable or grad_in` — autograd records the instance's ops; also true for
  a `bias_only` instance (peft bias='all' / 'lora_only': its parameters named `bias` train,
  its weights stay frozen; the formula sees `bias_trains`).

peft's `modules_to_save` replaces each module it names by a ModulesToSaveWrapper
(`modules_to_save` type): its first child is the original module (`original_module`:
frozen, kept in memory, never run: `idle`), its second the trainable deep copy that runs
the forward (`modules_to_save`).

Tensor names: a child's tensor input written `{name}` is the parent's tensor input `name`;
a plain name is local to the parent instance; an unbound tensor input is local to the
instance itself. So siblings that read one tensor (q, k, v reading the normed input) share
one name, and repeated instances never do unless the parent passes the same tensor to all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, NamedTuple

from ..errors import Diagnostic, MemspecError, UsageError
from ..library.formula import Child, Formula, Library, bind, copies, integer
from .peft import bias_elements, check_bias_modelled, check_not_retargeted, lora_target, quantized, save_error, save_matches, saved_name, peft_problems
from .formula_context import formula_context as _context
from .resolve import Module, Setup, Spec


@dataclass(frozen=True)
class Instance:
    path: str  # concrete: language.layers[3].self_attn.q_proj
    template: str  # indices of repeated levels as {}: language.layers[{}].self_attn.q_proj
    index: tuple[int, ...]  # the indices that fill the template
    module: str
    formula: Formula
    scope: Mapping[str, Any]
    tensors: Mapping[str, str]  # tensor input -> concrete tensor name
    trainable: bool
    grad_in: bool
    grad_flows: bool
    checkpointed: bool  # this instance is a gradient-checkpointing unit
    children: tuple["Instance", ...]
    # Its parameters require grad but get none (the output reaches no loss), and a mixed-
    # precision optimizer keeps fp32 masters and states for every such parameter anyway.
    flat_states: bool = False
    # A layer HF lists in _no_split_modules (its checkpointing unit): an FSDP2 unit of its own
    shard_unit: bool = False
    # peft bias='all' / 'lora_only': only the parameters named `bias` require grad (the
    # formula's parameter tensors named `bias`); the weights are frozen
    bias_only: bool = False
    # a ModulesToSaveWrapper's original_module: resident, frozen, never run in the forward
    idle: bool = False
    # the tensor it returns, where its formula's parent names it (Child.output): the concrete
    # name a later sibling reads and saves
    output: str | None = None

    def local(self, name: str) -> str:
        return f"{self.path}/{name}"

    def tensor(self, template: str) -> str:
        """Concrete name of a saved-tensor entry: "{input}" or a local name (evaluate binds
        every saved tensor of every instance through it)."""
        if template[:1] == "{" and template[-1:] == "}":
            return self.tensors[template[1:-1]]
        return self.path + "/" + template

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()


def experiment_scope(setup: Setup) -> dict[str, int]:
    """The experiment's names a module's context expressions (batch, seq) read.
    NB: packing makes the language model's batch one row of every token (text-only, E316)."""
    rows_b, rows_s = setup.rows
    # NB: a video is its temporal patches, each read by the tower as an image of its frame size
    return {
        "micro_batch": rows_b,
        "seq_len": rows_s,
        "target_len": setup.target_len,
        "images_per_sample": setup.vision_items,
        "image_h": setup.image_hw[0],
        "image_w": setup.image_hw[1],
        "grid_rows": setup.grid[0],
        "grid_cols": setup.grid[1],
        "videos_per_sample": setup.videos_per_sample,
        "video_frames": setup.video_frames,
    }


def expand(spec: Spec, setup: Setup, library: Library, reuse: dict | None = None) -> tuple[Instance, ...]:
    """`reuse`: a dict the caller keeps across the expansions of one spec and library (a
    search's or a sweep's), where a module's root made before is taken again when its inputs
    are the same (`_reused_root`)."""
    ex = _Expansion(library, roots={m.name: m.type for m in spec.modules})
    problems: list[Diagnostic] = []
    roots = []
    grad = False
    experiment = experiment_scope(setup)
    unread = None if reuse is None else replace(setup, **UNREAD)
    for m in spec.modules:
        if m.type not in library:
            problems.append(_unknown_type(spec, m, library))
            continue
        scope = {**experiment, **{k: v for k, v in m.inputs.items()}}
        batch = integer(m.batch, m.batch(scope))
        seq = integer(m.seq, m.seq(scope))
        try:
            if reuse is None:
                root = _root(ex, m, setup, batch, seq, grad, _module_locate(spec, m.path))
            else:
                root = _reused_root(reuse, (spec, library, m, batch, seq, grad, m.name in setup.gradient_checkpointing, unread), ex, setup)
        except MemspecError as exc:
            problems.extend(exc.diagnostics)
            continue
        roots.append(root)
        grad = _grad_out(root)
        short = _image_tokens_over_seq(root, setup)
        if short:
            line, col = spec.doc.where(m.path)
            problems.append(
                Diagnostic(
                    "E723",
                    spec.file,
                    line,
                    col,
                    m.path,
                    short,
                    "seq_len counts the LLM positions of the text and the image tokens together: raise it, or give a smaller image_size",
                )
            )
    if not problems:
        problems.extend(peft_problems(setup, tuple(roots), ex.matched))
    if problems:
        # NB: problems only with flags (--lora-modules-to-save) are the command line's: exit 2
        raise (UsageError if all(not d.file for d in problems) else MemspecError)(problems)
    return tuple(roots)


# What a module's expansion never reads of a Setup, set to one value in `_reused_root`'s key:
# seq_len (read through the module's own batch and seq, computed before), the checkpointed
# modules (read as whether this module is one), and what only the walks and the replay read.
# NB: a field belongs here only while nothing in this module, peft.py or the formulas' binding
# reads it (tests/test_fit.py holds an expansion with reuse equal to one without).
UNREAD: Mapping[str, Any] = {
    "seq_len": 0,
    "gradient_checkpointing": frozenset(),
    "dp": 1,
    "zero": 0,
    "deepspeed": None,
    "gpu": None,
    "target": None,
    "margin": None,
    "alloc_conf": None,
}


def _reused_root(reuse: dict, key: tuple, ex: _Expansion, setup: Setup) -> Instance:
    """A module's root from `reuse` when made before from the same inputs: the spec, library
    and module (the same objects), its batch and seq, whether an earlier module's output
    requires grad, whether it is checkpointed, and the setup with `UNREAD` set; else made and
    kept there. The modules_to_save names it matched are matched again."""
    spec, library, m, batch, seq, grad, checkpointing, unread = key
    entries = reuse.setdefault(("root", id(spec), id(library), m.name, batch, seq, grad, checkpointing), [])
    for held, root, matched in entries:
        if held[:3] == (spec, library, m) and held[3] == unread:
            ex.matched.update(matched)
            return root
    before = set(ex.matched)
    root = _root(ex, m, setup, batch, seq, grad, _module_locate(spec, m.path))
    # NB: the key's objects ride along, so that the ids in it stay theirs
    entries.append(((spec, library, m, unread), root, ex.matched - before))
    return root


def _unknown_type(spec: Spec, m: Module, library: Library) -> Diagnostic:
    """E301: a module whose layer type no formula file defines."""
    from ..errors import did_you_mean

    line, col = spec.doc.where(m.path + ".type")
    return Diagnostic(
        "E301",
        spec.file,
        line,
        col,
        m.path + ".type",
        f"unknown layer type '{m.type}'",
        did_you_mean(m.type, library.known or library.formulas) or "layer types are the file stems in formulas/",
    )


def _module_locate(spec: Spec, module_path: str):
    """locate(key, message, help): the diagnostic of a module's input `key` (the module itself
    for none), at its place in the spec."""

    def locate(key, message, help):
        if not key:
            path = module_path
        elif message.startswith("missing input"):
            path = f"{module_path}.inputs"  # NB: a missing key is shown at the mapping that lacks it
        else:
            path = f"{module_path}.inputs.{key}"
        line, col = spec.doc.where(path)
        return Diagnostic(_code(message), spec.file, line, col, path, message, help)

    return locate


def _root(ex: _Expansion, m: Module, setup: Setup, batch: int, seq: int, grad: bool, locate) -> Instance:
    """A module's root instance (wrapped when modules_to_save names the module); `grad`:
    whether an earlier module's output requires grad."""
    kw = dict(
        path=m.name,
        template=m.name,
        index=(),
        module=m.name,
        given=m.inputs,
        tensors={},
        setup=setup,
        batch=batch,
        seq=seq,
        trainable=m.name in setup.trainable,
        # NB: enable_input_require_grads() hooks every input embedding (a vision
        # tower's patch embedding, the token embeddings): its output requires grad.
        grad_in=grad or setup.input_require_grads,
        reaches_loss=True,
        checkpointing=m.name in setup.gradient_checkpointing,
        checkpointed=False,
        locate=locate,
        bias_ok=setup.lora is not None and setup.lora.bias == "all",
    )
    target = saved_name(setup.lora, m.name, m.type)
    return _wrapped(ex, ex.library[m.type], kw, target) if target is not None else _instance(ex, ex.library[m.type], **kw)


def image_merge(root: Instance) -> Instance | None:
    """The image merge under `root`: its scope holds the images per sample and the LLM
    positions each takes at the experiment's image size (tiles, native resolution)."""
    return next((inst for inst in root.walk() if inst.formula.layer_type == "image_merge"), None)


def merged_items(inst: Instance) -> tuple[int, int]:
    """(items per sample, LLM positions each) of an image merge: its `items` input, or the
    images when it leaves that out (LLaVA-NeXT-Video merges its video frames apart)."""
    items = inst.scope["items"]
    return (inst.scope["images"] if items < 0 else items), inst.scope["image_tokens"]


def merged_positions(root: Instance) -> list[tuple[int, int]]:
    """merged_items of every image merge under `root` (images, then video frames)."""
    return [merged_items(inst) for inst in root.walk() if inst.formula.layer_type == "image_merge"]


Span = tuple[int, int, int]  # (root index, first child, end child): a run of a root's children


def forward_order(roots: tuple[Instance, ...]) -> tuple[Span, ...]:
    """The order the step's forward runs the roots' children in, as spans of each root's
    children; the backward runs it in reverse.

    Modules run in spec order, except at an image merge: a root whose own child is an
    `image_merge` runs its children before the merge (the token embeddings: every
    multimodal forward embeds `input_ids` first, then computes the image features, then
    scatters them in), then the modules before it (the vision tower and projector that make
    the features), then the merge and the rest. Autograd's backward runs the nodes in the
    reverse of their creation (torch/csrc/autograd/engine.cpp: the ready queue pops the
    highest sequence_nr first, and a node is created after its inputs), so the tower's
    backward runs before the token embeddings'.

    transformers/models/{llava,llava_next,qwen2_vl,qwen2_5_vl,paligemma,idefics3,internvl}/
    modeling_*.py, *Model.forward: `inputs_embeds = self.get_input_embeddings()(input_ids)`,
    then `get_image_features`, then `masked_scatter`. NB: a root that is itself a
    checkpointing or FSDP unit is never split (no spec makes one).
    """
    spans: list[Span] = []
    for i, root in enumerate(roots):
        whole = (i, 0, len(root.children))
        k = next((j for j, c in enumerate(root.children) if c.formula.layer_type == "image_merge"), None)
        if k is None or not spans or root.checkpointed or root.shard_unit:
            spans.append(whole)
            continue
        spans = [(i, 0, k), *spans, (i, k, len(root.children))]
    return tuple(spans)


def _image_tokens_over_seq(root: Instance, setup: Setup) -> str | None:
    """The positions an image merge scatters, when the image size makes them more than
    seq_len holds (resolve checks the spec's own image size; a native-resolution tower or
    dynamic tiles give other sizes their token count in the formulas only)."""
    inst = image_merge(root)
    if inst is None:
        return None
    merges = merged_positions(root)
    need = sum(n * t for n, t in merges)
    if need <= inst.scope["seq"]:
        return None
    size = f" at image size {setup.image_hw[0]} x {setup.image_hw[1]}" if setup.image_size else ""
    terms = " + ".join(f"{n} x {t}" for n, t in merges if n)
    return f"seq_len {inst.scope['seq']} is shorter than the image tokens it must hold ({terms} = {need}{size})"


def _grad_out(inst: Instance) -> bool:
    """Whether an instance's output requires grad: its input did (residual paths carry it
    through a composite) or a child's output does (children past a tower's feature layer
    reach no loss: a trained tower's output is its feature layer's, not its last child's)."""
    if not inst.children:
        return inst.grad_flows
    return inst.grad_in or any(_grad_out(c) for c in reversed(inst.children))


@dataclass
class _Expansion:
    """What one expansion shares while it builds the tree: the formula library; `memo`, where
    identical instances (the 32 decoder layers) find their bound scope, their children's
    values and their peft-edited inputs, each distinct (formula, inputs, context) made once
    (the ids in its keys are of mappings it holds, so they stay its own); `matched`, the
    modules_to_save names that matched a module (unmatched_saves)."""

    library: Library
    memo: dict = field(default_factory=dict)
    matched: set = field(default_factory=set)
    roots: dict = field(default_factory=dict)  # module name -> its root layer type (peft.RETARGETED)


def _bound_scope(memo: dict, formula: Formula, given: Mapping[str, Any], scope_key: tuple, context: Callable[[], dict], locate) -> dict:
    key = ("bind",) + scope_key
    hit = memo.get(key)
    if hit is None:
        scalars = {k: v for k, v in given.items() if k not in _tensor_inputs(formula)}
        # NB: `given` rides along so that the id in the key stays its own for the expand.
        hit = memo[key] = (given, bind(formula, scalars, context(), locate))
    return hit[1]


def _child_values(memo: dict, child: Child, c_formula: Formula, scope: Mapping[str, Any], previous: bool, scope_key: tuple, upstream: bool = False) -> tuple:
    key = ("child", child.path, c_formula.layer_type, scope_key, previous, upstream)
    hit = memo.get(key)
    if hit is None:
        count = copies(child.count, child.count(scope), child.name) if child.count is not None else 1
        if child.when is not None and not child.when(scope):
            count = 0
        c_batch = integer(child.context["batch"], child.context["batch"](scope)) if "batch" in child.context else scope["batch"]
        c_seq = integer(child.context["seq"], child.context["seq"](scope)) if "seq" in child.context else scope["seq"]
        c_grad_in = bool(child.grad_in({**scope, "previous": previous, "upstream": upstream})) if child.grad_in is not None else previous
        c_reaches = bool(child.reaches_loss(scope)) if child.reaches_loss is not None else True
        c_given = {k: (e.constant if _is_tensor(c_formula, k) else e(scope)) for k, e in child.inputs.items()}
        hit = memo[key] = (count, c_batch, c_seq, c_grad_in, c_reaches, c_given)
    return hit


def _instance(
    ex: _Expansion,
    formula: Formula,
    *,
    path,
    template,
    index,
    module,
    given,
    tensors,
    setup,
    batch,
    seq,
    trainable,
    grad_in,
    reaches_loss,
    checkpointing,
    checkpointed,
    locate,
    shard_unit=False,
    bias_ok=False,
    idle=False,
    saved=False,
    output=None,
) -> Instance:
    """One instance and its children. `bias_ok`: peft's bias option turns on this instance's
    parameters named `bias` (bias='all' everywhere; 'lora_only' a LoRA layer's base layer);
    `idle`: inside a ModulesToSaveWrapper's original_module; `saved`: inside a module that
    modules_to_save copies (peft puts no adapter there)."""
    scope, scope_key, requires_grad, trainable, grad_in, flat_states, bias_only = _own_scope(
        ex, formula, given, setup, path, batch, seq, trainable, grad_in, reaches_loss, checkpointing, locate, bias_ok, idle
    )
    bound = {name: tensors.get(name) or f"{path}/{local}" for name, local in _tensor_defaults(ex.memo, formula)}
    parent = _Parent(formula, scope, scope_key, bound, setup, path, template, index, module, requires_grad, reaches_loss, checkpointing, locate, idle, saved)
    return Instance(
        path=path,
        template=template,
        index=index,
        module=module,
        formula=formula,
        scope=scope,
        tensors=bound,
        trainable=trainable,
        grad_in=grad_in,
        grad_flows=trainable or grad_in or (bias_only and reaches_loss),
        checkpointed=checkpointed,
        children=_children(ex, parent, grad_in),
        flat_states=flat_states,
        shard_unit=shard_unit,
        bias_only=bias_only,
        idle=idle,
        output=output,
    )


def _own_scope(
    ex: _Expansion,
    formula: Formula,
    given,
    setup: Setup,
    path: str,
    batch: int,
    seq: int,
    trainable: bool,
    grad_in: bool,
    reaches_loss: bool,
    checkpointing: bool,
    locate,
    bias_ok: bool,
    idle: bool,
) -> tuple:
    """An instance's own grad-flow flags and the scope its formula is evaluated in:
    (scope, scope_key, requires_grad, trainable, grad_in, flat_states, bias_only)."""
    # NB: DeepSpeed's flat fp32 partition covers every parameter that requires grad, reached
    # or not; torch's own optimizers skip a parameter whose .grad stays None.
    requires_grad = trainable
    # NB: FSDP2's optimizer is torch's, on the sharded parameters: no flat partition
    flat_states = requires_grad and not reaches_loss and setup.master_bytes > 0 and setup.fsdp is None
    trainable = requires_grad and reaches_loss
    grad_in = grad_in and reaches_loss and not idle
    # Instances with the same formula, the same inputs mapping and the same context share
    # one scope (identical instances are built from one memoised inputs mapping).
    scope_key = (id(formula), id(given), batch, seq, trainable, grad_in, checkpointing, requires_grad)
    scope = _bound_scope(
        ex.memo, formula, given, scope_key, lambda: _context(setup, batch, seq, trainable, grad_in, checkpointing, requires_grad=requires_grad), locate
    )
    bias_only = False
    if bias_ok and not requires_grad and not idle:
        check_bias_modelled(setup, formula, scope, path)
        if bias_elements(formula, scope) > 0:
            bias_only = True
            flat_states = not reaches_loss and setup.master_bytes > 0 and setup.fsdp is None
            if reaches_loss:
                scope = _bound_scope(
                    ex.memo,
                    formula,
                    given,
                    scope_key + ("bias",),
                    lambda: _context(setup, batch, seq, trainable, grad_in, checkpointing, bias_trains=True),
                    locate,
                )
    return scope, scope_key, requires_grad, trainable, grad_in, flat_states, bias_only


class _Parent(NamedTuple):
    """What the children of an instance being built take from it."""

    formula: Formula
    scope: Mapping[str, Any]
    scope_key: tuple
    tensors: Mapping[str, str]  # its tensor inputs, bound to concrete names
    setup: Setup
    path: str
    template: str
    index: tuple
    module: str
    requires_grad: bool
    reaches_loss: bool
    checkpointing: bool
    locate: Callable
    idle: bool
    saved: bool


def _children(ex: _Expansion, p: _Parent, grad_in: bool) -> tuple[Instance, ...]:
    """The instances of a parent's children in forward order, each child's copies in turn;
    `grad_in`: whether the parent's input requires grad (its first child's `previous`)."""
    setup, formula, scope = p.setup, p.formula, p.scope
    bias_all = setup.lora is not None and setup.lora.bias == "all"
    adapter = formula.layer_type in ADAPTED
    children = []
    previous = grad_in
    upstream = False  # any earlier sibling's output requires grad (parallel readers: q, k, v)
    for child in formula.children:
        c_formula = ex.library[child.type]
        count, c_batch, c_seq, c_grad_in, c_reaches, c_given = _child_values(ex.memo, child, c_formula, scope, previous, p.scope_key, upstream)
        if count == 0:
            continue
        c_reaches = p.reaches_loss and c_reaches
        c_tensors = {k: _tensor_name(v, p.tensors, p.path) for k, v in c_given.items() if _is_tensor(c_formula, k)}
        c_requires = p.requires_grad and not (child.frozen is not None and bool(child.frozen(scope)))
        plain = (c_formula, c_given, c_tensors, c_requires)
        c_formula, c_given, c_tensors, c_requires = _peft_child(
            ex, setup, formula, child, plain, path=p.path, module=p.module, idle=p.idle, saved=p.saved, adapter=adapter
        )
        # peft bias='all': every `.bias` of the model (the wrapped originals excepted);
        # 'lora_only': the bias of each LoRA layer (its base layer's)
        c_bias = bias_all or (setup.lora is not None and setup.lora.bias == "lora_only" and adapter and child.name == "base_layer")
        made, out = _copies(
            ex,
            child,
            count,
            c_formula,
            plain,
            dict(
                module=p.module,
                given=c_given,
                tensors=c_tensors,
                setup=setup,
                batch=c_batch,
                seq=c_seq,
                trainable=c_requires,
                reaches_loss=c_reaches,
                checkpointing=p.checkpointing,
                checkpointed=p.checkpointing and child.checkpoint_unit,
                locate=_child_locate(child, p.locate),
                shard_unit=child.checkpoint_unit,
                bias_ok=c_bias,
                idle=p.idle,
                saved=p.saved,
                output=_tensor_name(child.output, p.tensors, p.path) if child.output and count == 1 else None,
            ),
            path=p.path,
            template=p.template,
            index=p.index,
            grad_in=c_grad_in,
            previous=previous,
            adapter=adapter,
        )
        children.extend(made)
        previous = out
        upstream = upstream or out
    return tuple(children)


def _copies(
    ex: _Expansion,
    child,
    count: int,
    c_formula: Formula,
    plain: tuple,
    shared: dict,
    *,
    path: str,
    template: str,
    index: tuple,
    grad_in: bool,
    previous: bool,
    adapter: bool,
) -> tuple[list[Instance], bool]:
    """The `count` instances of one child (`shared`: the keywords they all take) and whether
    the last one's output requires grad (`previous` when the child reaches no loss); a child
    that modules_to_save names is wrapped."""
    setup, c_reaches, idle, saved = shared["setup"], shared["reaches_loss"], shared["idle"], shared["saved"]
    made, out = [], previous
    for i in range(count):
        name = f"{child.name}[{i}]" if count > 1 or child.count is not None else child.name
        c_template = f"{child.name}[{{}}]" if count > 1 or child.count is not None else child.name
        kw = dict(
            shared,
            path=f"{path}.{name}",
            template=f"{template}.{c_template}",
            index=index + ((i,) if "{}" in c_template else ()),
            grad_in=grad_in if i == 0 else out,
        )
        target = None if setup.lora is None or idle else saved_name(setup.lora, kw["path"])
        if target is not None and (saved or adapter):
            where = "inside the module modules_to_save already copies" if saved else f"inside the LoRA layer '{path}'"
            raise save_error(
                setup,
                target,
                "E322",
                f"modules_to_save '{target}' matches '{kw['path']}', {where}",
                "name the outer module only (peft wraps each matched module once; it refuses a LoRA layer's internals)",
            )
        if target is not None:
            kw["given"], kw["tensors"], kw["trainable"] = plain[1], plain[2], plain[3]
            inst = _wrapped(ex, plain[0], kw, target)
        else:
            inst = _instance(ex, c_formula, **kw)
        made.append(inst)
        out = _grad_out(inst) if c_reaches else out
    return made, out


def _peft_child(
    ex: _Expansion, setup: Setup, formula: Formula, child, plain: tuple, *, path: str, module: str, idle: bool, saved: bool, adapter: bool
) -> tuple[Formula, Mapping[str, Any], Mapping[str, str], bool]:
    """A child linear as peft leaves it: adapted by LoRA (its formula lora_linear, the adapters
    trained), quantized by bitsandbytes (frozen), or as it is. NB: the adapter's own linears
    (inside a lora_linear) are never adapted again, and peft adapts nothing inside a module
    modules_to_save names (_check_target_module_exists)."""
    c_formula, c_given, c_tensors, c_requires = plain
    if (
        setup.lora is not None
        and not (idle or saved)
        and c_formula.layer_type == "linear"
        and not adapter
        and lora_target(setup.lora, module, f"{path}.{child.name}")
    ):
        check_not_retargeted(setup, ex.roots.get(module), f"{path}.{child.name}", child.name)
        c_formula, c_given, c_tensors = _with_lora(ex, setup.lora, c_given, c_tensors)
        c_requires = True  # the adapters train; lora_linear's base_layer is frozen
    elif (
        setup.quantization is not None
        and c_formula.layer_type == "linear"
        and quantized(setup.quantization, module, formula.layer_type, child.name, f"{path}.{child.name}")
    ):
        if idle or saved:
            raise save_error(
                setup,
                saved_name(setup.lora, path) or "",
                "E322",
                f"modules_to_save copies '{path}', which holds the bitsandbytes-quantized linear '{child.name}': peft's deep copy "
                "of a 4-/8-bit weight cannot require grad",
                "name an unquantized module (the quantization block's skip_modules keep it in 16 bits)",
            )
        c_formula, c_given = _quantized(ex, setup.quantization, c_given)
        c_requires = False
    return c_formula, c_given, c_tensors, c_requires


ADAPTED = ("lora_linear", "dora_linear")
# The layer type of peft's ModulesToSaveWrapper (formulas/modules_to_save.yaml)
WRAPPER = "modules_to_save"


def _wrapped(ex: _Expansion, formula: Formula, kw: dict, target: str) -> Instance:
    """peft's ModulesToSaveWrapper around the instance `kw` describes (utils/other.py,
    ModulesToSaveWrapper.update): `original_module`, the module itself, frozen
    (requires_grad_(False), after bias='all' turned its biases on) and never run; then
    `modules_to_save`, its copy.deepcopy, every parameter trainable, which runs the forward.
    A copy of a tied embedding table is a new, untied table (deepcopy copies the shared weight
    into the copy alone)."""
    ex.matched.update(t for t in kw["setup"].lora.modules_to_save if save_matches(t, kw["path"], formula.layer_type))
    given = kw["given"]
    if given.get("shared_weight"):
        key = ("untied", id(given))
        hit = ex.memo.get(key)
        if hit is None:
            hit = ex.memo[key] = (given, {**given, "shared_weight": False})
        given = hit[1]
    original = _instance(
        ex,
        formula,
        **{
            **kw,
            "path": kw["path"] + ".original_module",
            "template": kw["template"] + ".original_module",
            "trainable": False,
            "grad_in": False,
            "checkpointed": False,
            "shard_unit": False,
            "bias_ok": False,
            "idle": True,
            "saved": True,
        },
    )
    copy = _instance(
        ex,
        formula,
        **{
            **kw,
            "path": kw["path"] + ".modules_to_save",
            "template": kw["template"] + ".modules_to_save",
            "given": given,
            "trainable": True,
            "bias_ok": False,
            "saved": True,
        },
    )
    w = ex.library[WRAPPER]
    scope = _bound_scope(
        ex.memo,
        w,
        {},
        (id(w), kw["batch"], kw["seq"], copy.trainable, kw["grad_in"]),
        lambda: _context(kw["setup"], kw["batch"], kw["seq"], copy.trainable, copy.grad_in, kw["checkpointing"]),
        kw["locate"],
    )
    return Instance(
        path=kw["path"],
        template=kw["template"],
        index=kw["index"],
        module=kw["module"],
        formula=w,
        scope=scope,
        tensors={},
        trainable=copy.trainable,
        grad_in=copy.grad_in,
        grad_flows=copy.grad_flows,
        checkpointed=False,
        children=(original, copy),
    )


def _quantized(ex: _Expansion, q, given: Mapping[str, Any]) -> tuple:
    key = ("quantized", id(given), q.bits, q.double_quant)
    hit = ex.memo.get(key)
    if hit is None:
        extra = {"double_quant": q.double_quant} if q.bits == 4 else {}
        # NB: `shards` (sequence parallelism) is always 1 here: quantization with tensor
        # parallelism is refused (E318), and the bitsandbytes layers take no such input
        hit = ex.memo[key] = (given, {**{k: v for k, v in given.items() if k != "shards"}, **extra})
    return ex.library["linear_4bit" if q.bits == 4 else "linear_8bit"], hit[1]


def _with_lora(ex: _Expansion, lora, given: Mapping[str, Any], tensors: Mapping[str, str]) -> tuple:
    """A linear child as a `lora_linear` (`dora_linear` with use_dora): its inputs plus the
    adapter's, and lora_A reading x itself when there is no dropout (nn.Identity)."""
    key = ("lora", id(given))
    hit = ex.memo.get(key)
    if hit is None:
        hit = ex.memo[key] = (given, {**given, "lora_r": lora.r, "lora_dropout": lora.dropout > 0})
    out = dict(tensors)
    if not lora.dropout > 0 and "input" in tensors:
        out["lora_input"] = tensors["input"]
    return ex.library["dora_linear" if lora.use_dora else "lora_linear"], hit[1], out


def _tensor_defaults(memo: dict, formula: Formula) -> tuple[tuple[str, str], ...]:
    """(name, local name when unbound) of each tensor input of `formula`, in its order."""
    key = ("tensors", id(formula))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (formula, tuple((i.name, i.default or i.name) for i in formula.inputs if i.type == "tensor"))
    return hit[1]


def _tensor_inputs(formula: Formula) -> frozenset[str]:
    return formula.tensor_inputs


def _is_tensor(formula: Formula, key: str) -> bool:
    return key in formula.tensor_inputs


def _tensor_name(value: str, bound: Mapping[str, str], parent_path: str) -> str:
    if value.startswith("{") and value.endswith("}"):
        return bound[value[1:-1]]
    return f"{parent_path}/{value}"


def _child_locate(child: Child, parent_locate):
    def locate(key, message, help):
        expr = child.inputs.get(key)
        if expr is None:
            return parent_locate("", message, help)
        return expr.diag(_code(message), message, help)

    return locate


def _code(message: str) -> str:
    """The code of a message from `formula.bind`: a missing input, a bad value or an unknown one."""
    if message.startswith("missing input"):
        return "E201"
    return "E206" if "must be" in message else "E203"
