"""Stage 6, evaluate: every layer instance's formula becomes exact integer bytes.

Contract: `evaluate(roots)` returns a `Node` tree mirroring the `Instance` tree, each node
with its own `Cost` (parameters, gradients, optimizer states, buffers, the tensors it saves
for backward by concrete name, what it keeps as a checkpointing unit, and its forward and
backward transients), and `layer_table(nodes)` collapses identical instances into the rows
of the layer table. A formula is evaluated once per distinct scope: the 32 identical
decoder layers of a 7B model cost one evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

from ..memory import optimizers
from ..errors import Diagnostic, MemspecError
from .expand import Instance, image_merge, merged_positions
from ..memory.optimizers import Optimizer
from ..library.formula import FACTOR_NAMES, Formula, integer


@dataclass(frozen=True)
class Cost:
    parameters: int
    gradients: int
    optimizer_states: int
    buffers: int
    param_tensors: tuple[int, ...]  # each parameter tensor's bytes (parameters is their sum)
    buffer_tensors: tuple[int, ...]  # each buffer tensor's bytes (buffers is their sum)
    param_shapes: tuple[tuple[int, ...] | None, ...]  # each parameter tensor's dims, where its formula gives them
    saved: tuple[tuple[str, int], ...]  # (tensor, bytes) kept for backward, in declaration order, zeros dropped
    held: tuple[tuple[str, int], ...]  # (tensor, bytes) alive until the forward ends, not kept for backward
    checkpoint: tuple[tuple[str, int], ...]  # kept instead of `saved` by a checkpointing unit
    transient_forward: int
    transient_backward: int
    param_rows: tuple[int, ...] = ()  # dim 0 of each parameter tensor (0: not given), as param_tensors
    # An FSDP unit's inputs (its checkpoint saves, checkpointing or not): alive around the
    # unit's all-gathers, before any of its layers charges them
    unit_input: tuple[tuple[str, int], ...] = ()
    # saved tensors that become this layer's parameter gradients in backward (until: gradient)
    handover: tuple[str, ...] = ()
    # saved tensors the training loop holds until the whole backward has run (until: step)
    pinned: tuple[str, ...] = ()
    # saved tensors also alive until the forward ends when not kept (a checkpointing unit's
    # first forward): autocast's cached 16-bit weight copies
    cached: tuple[tuple[str, int], ...] = ()
    # saved tensors also alive, when not kept, until the checkpointing unit's first forward
    # returns: what a module returns to the layer that holds it (eager attention's weights)
    returned: tuple[tuple[str, int], ...] = ()
    param_names: tuple[str, ...] = ()  # each parameter tensor's attribute name, as param_tensors
    # the order of the layer's own transient tensors, forward and backward, for the caching
    # allocator's replay: (op, name, bytes), op alloc | free | saved (a saved tensor's name)
    allocations_forward: tuple[tuple[str, str, int], ...] = ()
    allocations_backward: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True)
class Node:
    inst: Instance
    cost: Cost
    children: tuple["Node", ...]

    def walk(self) -> tuple["Node", ...]:
        """This node and its descendants in forward order (the descendants computed once: the
        simulator and the table walk the tree many times)."""
        return (self,) + self._below

    @cached_property
    def _below(self) -> tuple["Node", ...]:
        """The descendants in forward order. NB: not the node itself, which would make every
        tree a reference cycle, freed only by the garbage collector (a search makes and drops
        a tree per estimate)."""
        out: list[Node] = []
        stack: list[Node] = list(reversed(self.children))
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(n.children))
        return tuple(out)


def _numbers(formula: Formula, scope: Mapping[str, Any], memo: dict) -> tuple:
    key = (id(formula), id(scope))  # NB: identical instances share one scope object (expand)
    hit = memo.get(key)
    if hit is None:
        params = tuple(integer(e, e(scope)) for e in formula.param_tensors)
        shapes = tuple(None if dims is None else tuple(integer(d, d(scope)) for d in dims) for dims in formula.param_shapes)
        buffers = tuple(integer(e, e(scope)) for e in formula.buffers)
        factors = tuple(integer(formula.factors[n], formula.factors[n](scope)) if n in formula.factors else 0 for n in FACTOR_NAMES)
        factors = (
            sum(params),
            *factors,
            sum(buffers),
            tuple(b for b in params if b),
            tuple(b for b in buffers if b),
            tuple(s for b, s in zip(params, shapes) if b),
            tuple(n for b, n in zip(params, formula.param_names) if b),
        )
        saved = tuple(integer(s.bytes, s.bytes(scope)) for s in formula.activations)
        ckpt = tuple(integer(s.bytes, s.bytes(scope)) for s in formula.checkpoint)
        tf = integer(formula.transient["forward"], formula.transient["forward"](scope)) if "forward" in formula.transient else 0
        tb = integer(formula.transient["backward"], formula.transient["backward"](scope)) if "backward" in formula.transient else 0
        given = tuple(integer(e, e(scope)) for e in formula.param_rows) or (0,) * len(params)
        rows = tuple(r for b, r in zip(params, given) if b)
        order = {
            phase: tuple((a.op, a.name, integer(a.bytes, a.bytes(scope)) if a.bytes is not None else 0) for a in entries)
            for phase, entries in formula.allocations.items()
        }
        hit = memo[key] = (factors, saved, ckpt, tf, tb, rows, order)
    return hit


def evaluate(
    roots: tuple[Instance, ...], optimizer: Optimizer | None = None, state_bytes: int = 0, master_bytes: int = 0, reuse: dict | None = None
) -> tuple[Node, ...]:
    """`optimizer` (with one state element's bytes and the master copy's) replaces the formulas' element-wise
    `bytes.optim` by the optimizer's own states where they are not element-wise (Adafactor's
    factored moments, bitsandbytes' 8-bit blocks). `reuse`: as `expand`'s, where a root
    evaluated before (the same object, from expand's reuse) with the same optimizer states is
    taken again."""
    memo: dict = {}
    states = None if optimizer is None or optimizers.is_elementwise(optimizer) else (optimizer, state_bytes, master_bytes)
    if reuse is None:
        return tuple(_node(r, memo, states) for r in roots)
    out = []
    for r in roots:
        entries = reuse.setdefault(("node", id(r)), [])
        node = next((n for root, held, n in entries if root is r and held == states), None)
        if node is None:
            node = _node(r, memo, states)
            entries.append((r, states, node))  # NB: the root rides along, so that its id stays its own
        out.append(node)
    return tuple(out)


def trained(inst: Instance, tensors: tuple, shapes: tuple, names: tuple) -> tuple[tuple, tuple]:
    """(bytes, shapes) of the parameter tensors of a layer that require grad: all of them, or
    for a bias_only layer (peft's bias option) those named `bias`."""
    if inst.bias_only:
        keep = [i for i, n in enumerate(names) if n == "bias"]
        return tuple(tensors[i] for i in keep), tuple(shapes[i] for i in keep)
    return tensors, shapes


def _node(inst: Instance, memo: dict, states: tuple | None = None) -> Node:
    f = inst.formula
    factors, saved, ckpt, tf, tb, rows, order = _numbers(f, inst.scope, memo)
    *factors, shapes, names = factors
    b = inst.scope["bytes"]
    params, grads, optim, *buffers = factors
    if inst.idle:
        # NB: a ModulesToSaveWrapper's original_module: its weights stay, nothing runs
        return Node(
            inst,
            Cost(params, 0, 0, factors[3], factors[4], factors[5], shapes, (), (), (), 0, 0, param_rows=rows, param_names=names),
            tuple(_node(c, memo, states) for c in inst.children),
        )
    if inst.bias_only:
        # NB: peft's bias option: the tensors named bias alone have gradients and states (the
        # formula's own factors count a frozen layer's: none)
        mine, _ = trained(inst, factors[4], shapes, names)
        elements = sum(mine) // b["param"]
        reached = bool(inst.scope["bias_trains"])
        grads, optim = elements * b["grad"] if reached else 0, elements * b["optim"] if reached or inst.flat_states else 0
        factors = (params, grads, optim, *buffers)
    if inst.flat_states or (states is not None and (optim or grads)):
        mine, mine_shapes = trained(inst, factors[4], shapes, names)
        if states is None:
            optim = sum(mine) // b["param"] * b["optim"]
        else:
            optim = _optimizer_states(inst, mine, mine_shapes, b, *states)
        factors = (params, grads, optim, *buffers)
    saved_t, held_t, handover_t, pinned_t, cached_t, returned_t, ckpts, forward, backward = _unbound(f, inst.scope, saved, ckpt, order, memo)
    name = inst.tensor
    kept = tuple([(name(n), b) for n, b in ckpts]) if ckpts and (inst.checkpointed or inst.shard_unit) else ()
    cost = Cost(
        *factors,
        param_shapes=shapes,
        saved=tuple([(name(n), b) for n, b in saved_t]) if saved_t else (),
        held=tuple([(name(n), b) for n, b in held_t]) if held_t else (),
        checkpoint=kept if inst.checkpointed else (),
        transient_forward=tf,
        transient_backward=tb,
        param_rows=rows,
        unit_input=kept if inst.shard_unit else (),
        handover=tuple([name(n) for n in handover_t]) if handover_t else (),
        pinned=tuple([name(n) for n in pinned_t]) if pinned_t else (),
        cached=tuple([(name(n), b) for n, b in cached_t]) if cached_t else (),
        returned=tuple([(name(n), b) for n, b in returned_t]) if returned_t else (),
        param_names=names,
        allocations_forward=_bound(forward, name) if forward else (),
        allocations_backward=_bound(backward, name) if backward else (),
    )
    children = inst.children
    return Node(inst, cost, tuple([_node(c, memo, states) for c in children]) if children else ())


def _unbound(formula: Formula, scope: Mapping[str, Any], saved: tuple[int, ...], ckpt: tuple[int, ...], order: Mapping, memo: dict) -> tuple:
    """A formula's saved tensors, checkpoint tensors and allocation orders in one scope, with
    their bytes and the names as the formula writes them (each instance binds its own): the
    (name, bytes) of the activations with bytes kept for backward (every `until` but
    forward), of those held until the forward ends (`until: forward`), the names handed over
    as gradients (`until: gradient`) and pinned (`until: step`), the (name, bytes) of the
    cast-cached ones (`until: cached`), of the ones returned to the unit (`until: layer`) and
    of the checkpoint tensors, and each order's entries
    (`_order`). Computed once per scope, as `_numbers` is."""
    key = ("unbound", id(formula), id(scope))
    hit = memo.get(key)
    if hit is None:
        acts = tuple((s.tensor, b, s.until) for s, b in zip(formula.activations, saved) if b)
        ckpts = tuple((s.tensor, b) for s, b in zip(formula.checkpoint, ckpt) if b)
        hit = memo[key] = (
            tuple((n, b) for n, b, until in acts if until != "forward"),
            tuple((n, b) for n, b, until in acts if until == "forward"),
            tuple(n for n, _, until in acts if until == "gradient"),
            tuple(n for n, _, until in acts if until == "step"),
            tuple((n, b) for n, b, until in acts if until == "cached"),
            tuple((n, b) for n, b, until in acts if until == "layer"),
            ckpts,
            _order(order.get("forward", ()), formula, saved),
            _order(order.get("backward", ()), formula, saved),
        )
    return hit


def _bound(order: tuple, name) -> tuple[tuple[str, str, int], ...]:
    """An allocation order with its saved tensors named as the ledger names them, a forward's
    free of one (where the layer does not keep it) included."""
    saved = {n for op, n, _ in order if op == "saved"}
    return tuple([(op, name(n) if op == "saved" or (op == "free" and n in saved) else n, size) for op, n, size in order])


def _order(entries: tuple, formula: Formula, saved: tuple[int, ...]) -> tuple[tuple[str, str, int], ...]:
    """An allocation order with each saved tensor's bytes (its name still the formula's:
    the instance binds it as the ledger names it); an entry of no bytes (a variant the
    formula does not run) is left out, and so is the free of such an alloc."""
    sizes = {s.tensor: b for s, b in zip(formula.activations, saved)}
    entries = tuple((op, name, sizes.get(name, 0) if op == "saved" else size) for op, name, size in entries)
    empty = {name for op, name, size in entries if op not in ("free", "grad") and not size}
    return tuple((op, name, size) for op, name, size in entries if name not in empty)


def _optimizer_states(
    inst: Instance, tensors: tuple[int, ...], shapes: tuple, b: Mapping[str, int], optimizer: Optimizer, state_bytes: int, master_bytes: int
) -> int:
    """A layer's optimizer bytes from its tensors: the fp32 master copy plus every state
    tensor the optimizer makes for each (compiler/memory/optimizers.py)."""
    total = 0
    for nbytes, shape in zip(tensors, shapes):
        elements = nbytes // b["param"]
        if optimizer.type == "adafactor" and shape is None:
            raise MemspecError(
                Diagnostic(
                    "E306",
                    inst.formula.file,
                    0,
                    0,
                    "$.factors.parameters",
                    f"Adafactor needs each parameter tensor's shape; {inst.formula.layer_type} gives only its bytes ({inst.path})",
                    "list the parameters as {shape: [dims]} entries (formulas/README.md)",
                )
            )
        total += master_bytes * elements + sum(s.nbytes for s in optimizers.states(optimizer, elements, shape, state_bytes))
    return total


# --------------------------------------------------------------------------- layer table


@dataclass(frozen=True)
class Row:
    """One group of identical instances, in forward order; bytes are per instance."""

    path: str  # collapsed: language.layers[0:32].self_attn.q_proj
    type: str
    depth: int
    count: int
    module: str
    trainable: bool
    grad_flows: bool
    checkpointed: bool
    dims: str
    parameters: int
    gradients: int
    optimizer_states: int
    buffers: int
    activations: int | None  # None: everything it saves is charged to an earlier row
    held: int  # alive from this row until the forward ends (model outputs), not kept for backward
    transient_forward: int
    transient_backward: int


def first_charges(nodes: tuple[Node, ...]) -> dict[str, str]:
    """tensor name -> path of the instance that charges it (the first saver in forward order)."""
    owner: dict[str, str] = {}
    for root in nodes:
        for n in root.walk():
            for name, _ in n.cost.saved + n.cost.checkpoint:
                owner.setdefault(name, n.inst.path)
    return owner


def _dims(inst: Instance) -> str:
    """b, s and the inputs that differ from their defaults (so that a new input with a
    default leaves every existing table as it was)."""
    shown = [(i.name, inst.scope[i.name]) for i in inst.formula.inputs if i.type != "tensor" and not (i.has_default and inst.scope[i.name] == i.default)]
    ctx = f"b={inst.scope['batch']} s={inst.scope['seq']}"
    return " ".join([ctx] + [f"{k}={_fmt(v)}" for k, v in shown])


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def layer_table(nodes: tuple[Node, ...]) -> tuple[Row, ...]:
    owner = first_charges(nodes)
    dims: dict[int, str] = {}  # NB: identical instances share one scope object (expand's memo)
    groups: dict[tuple, list] = {}
    order: list[tuple] = []
    for root in nodes:
        for n in root.walk():
            inst, cost = n.inst, n.cost
            mine = [b for name, b in cost.saved + cost.checkpoint if owner[name] == inst.path]
            acts = sum(mine) if mine or not (cost.saved or cost.checkpoint) else None
            values = (
                inst.formula.layer_type,
                inst.path.count("."),
                inst.module,
                inst.trainable,
                inst.grad_flows,
                inst.checkpointed,
                dims[id(inst.scope)] if id(inst.scope) in dims else dims.setdefault(id(inst.scope), _dims(inst)),
                cost.parameters,
                cost.gradients,
                cost.optimizer_states,
                cost.buffers,
                acts,
                sum(b for _, b in cost.held),
                cost.transient_forward,
                cost.transient_backward,
            )
            key = (inst.template, values)
            if key not in groups:
                groups[key] = []
                order.append(key)
            groups[key].append(inst.index)
    rows = []
    for key in order:
        template, values = key
        indices = groups[key]
        rows.append(Row(_collapse(template, indices), values[0], values[1], len(indices), *values[2:]))
    return tuple(rows)


def _collapse(template: str, indices: list[tuple[int, ...]]) -> str:
    """language.layers[{}].mlp with indices (0,)..(31,) -> language.layers[0:32].mlp."""
    if not indices or not indices[0]:
        return template
    parts = []
    for level in range(len(indices[0])):
        values = sorted({ix[level] for ix in indices})
        if values == list(range(values[0], values[-1] + 1)) and len(values) > 1:
            parts.append(f"{values[0]}:{values[-1] + 1}")
        elif len(values) == 1:
            parts.append(str(values[0]))
        else:
            parts.append(",".join(map(str, values)))
    return template.format(*parts)


def image_tokens_per_sample(nodes: tuple[Node, ...]) -> int | None:
    """The LLM positions the images of one sample take, as the formulas count them at the
    experiment's image size (image_merge: images x tokens per image); None without a merge."""
    for n in nodes:
        if image_merge(n.inst) is not None:
            return sum(items * tokens for items, tokens in merged_positions(n.inst))
    return None
