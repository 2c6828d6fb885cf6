"""Stage 7, simulate: walk one training step and find its peak.

Contract: `simulate(nodes, setup)` returns an `Estimate`: the allocated-bytes timeline
of a steady-state step (forward, loss, backward, optimizer step, in that order), its peak with
the phase, layer and a module x category breakdown at that moment, the same for the first
step (no optimizer states until `step()` creates them), the seed paper's plain four-factor
sum, and the allocator's `reserved` (the step replayed, replay.py) and the device's
`nvidia-smi` figures derived from the peak. The walk, per DESIGN.md:

1. resident: weights, buffers, optimizer states (fp32 master copies included), each divided
   across data-parallel ranks as the ZeRO stage shards it;
2. forward, layer by layer in the order `expand.forward_order` gives (the modules' own, but
   a language model's token embeddings before the vision tower whose features its image
   merge reads): each layer's saved tensors join the live set the first time
   their name appears; its forward transient sits on top while it runs, inside the
   transients of the composites around it. A checkpointing unit keeps only its
   `checkpoint` tensors;
3. the loss is the last layer of the forward;
4. backward in the reverse of that order, as autograd runs it (the node created last first):
   a layer's gradients appear, its backward transient sits on top,
   then the tensors it charged are freed. A checkpointing unit first re-runs its forward
   (its saved tensors come back), then runs its backward;
5. optimizer step: gradients are all present; mixed precision makes fp32 copies of them;
   the optimizer's temporaries sit on top (torch steps one parameter group at a time: the
   largest group's); then gradients are freed (set_to_none). Step 1 makes the states
   during its step: group by group (torch), or tensor by tensor (Adafactor, bitsandbytes),
   so its optimizer peak holds only the states made by then.

Each parallelism strategy is a walk in `walks/` (ZeRO-1/2, ZeRO-3, FSDP2, DeepSpeed's
optimizer offload, pipeline parallelism, and the unsharded default): `simulate` walks the step
above and calls their hooks before and after each layer's forward and backward and at the
optimizer step (`walks/base.py`); what they add lives in their own module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from ..memory import allocator, optimizers
from ..memory.allocator import OutOfMemory
from .evaluate import Node, first_charges
from .expand import forward_order
from .replay import device_overhead, replay
from .resolve import Constant, Setup
from .walks import device_map, strategies
from .walks.base import Step, Walk
from .walks.optimizer_step import _paged_bytes, _trainable_elements, _trainable_tensors
from .walks.resident import _blocks
from .walks.timeline import ALLOCATOR_GRANULE, CATEGORIES, Point, State, push, round_up
from .walks.zero12 import _zero12_active

__all__ = ["ALLOCATOR_CONSTANTS", "CATEGORIES", "Estimate", "Point", "device_overhead", "simulate"]

_ALLOCATOR = "c10/cuda/CUDACachingAllocator.cpp"


ALLOCATOR_CONSTANTS = (
    Constant("kMinBlockSize", allocator.MIN_BLOCK, "B", f"{_ALLOCATOR}: every request rounds up to it (allocated)"),
    Constant("kSmallSize", allocator.SMALL_SIZE, "B", f"{_ALLOCATOR}: requests up to it come from the small pool's 2 MiB segments (reserved)"),
    Constant("kLargeBuffer", allocator.LARGE_BUFFER, "B", f"{_ALLOCATOR}: the segment of a request under kMinLargeAlloc (reserved)"),
    Constant("kMinLargeAlloc", allocator.MIN_LARGE_ALLOC, "B", f"{_ALLOCATOR}: requests of this size and more get their own segment (reserved)"),
    Constant("kRoundLarge", allocator.ROUND_LARGE, "B", f"{_ALLOCATOR}: such a segment rounds up to a multiple of it (reserved)"),
)


@dataclass(frozen=True)
class Estimate:
    peak: Point  # steady state: the tensors at the step's peak
    reserved: int  # the caching allocator's segments, highest over the steps replayed (see replay.replay)
    first_step: Point
    timeline: tuple[tuple[str, str, int], ...]  # (phase, path, allocated) per event, steady state
    resident: Mapping[str, Mapping[str, int]]  # module -> parameters/gradients/optimizer_states/buffers, per GPU
    activations_end_of_forward: Mapping[str, int]  # module -> saved bytes alive when the loss is computed
    seed_sum: int  # parameters + gradients + optimizer states + activations, summed (seed paper Eq. 1)
    not_modelled: tuple[str, ...]
    trainable_params: int  # elements, all ranks
    # torch.cuda.max_memory_allocated() of the steady step and of step 1: the replay's blocks,
    # each request rounded to 512 B and a remainder the allocator does not split counted with
    # its block; at least the tensors' peak (the replay left out, `reserved_bound`: that peak)
    allocated: int
    allocated_first_step: int
    oom: OutOfMemory | None = None  # the allocation that fails on `setup.gpu`, if one does
    reserved_bound: bool = False  # `reserved` is a lower bound: a probe's, the verdict known without the replay
    # device_map: each GPU's own estimate, by GPU index (this one is the GPU that needs the most)
    devices: tuple["Estimate", ...] = ()
    gpu: int | None = None  # device_map: the GPU this estimate is of


def simulate(nodes: tuple[Node, ...], setup: Setup, verdict_budget: int | None = None) -> Estimate:
    """`verdict_budget`: a search's probe, which needs only whether the device figure is
    within that many bytes: where the step's allocated peak alone puts it over, or the replay
    on a device without a limit passes the GPU, the replay (or its second run within the GPU)
    is left out and `reserved` is a lower bound (`reserved_bound`)."""
    if setup.device_map is not None and setup.device_map.gpu < 0:
        return _per_gpu_estimates(nodes, setup)
    trainable = _trainable_elements(nodes, setup)
    step = Step(nodes, setup, trainable)
    walks = [cls(step) for cls in strategies(setup, trainable)]
    placing = walks[0]
    p_div, g_div, o_div = placing.shards()
    step.blocks = {id(n): _blocks(n, setup, p_div, g_div, o_div) for r in nodes for n in r.walk()}
    modules = step.modules
    per_gpu = _per_gpu(step, placing)
    once = optimizers.once(setup.optimizer, [e for e, _ in _trainable_tensors(nodes, setup)])
    if once:
        # NB: optimizer-wide tensors (bitsandbytes' quantile maps) belong to no layer; shown
        # with the first module that trains.
        first = next(r.inst.module for r in nodes if any(n.cost.optimizer_states for n in r.walk()))
        per_gpu[first]["optimizer_states"] += sum(round_up(b, ALLOCATOR_GRANULE) for b in once)
    state = step.state = State(modules, per_gpu, first_charges(nodes))
    # NB: with nothing trainable there is no backward (and no optimizer step) to walk.
    state.workspace = (setup.target.gemm_threads if trainable else 1) * setup.target.workspace
    state.first_forward_workspace = setup.target.workspace
    state.level = sum(sum(c.values()) for c in per_gpu.values()) + state.workspace
    state.first_optim = placing.first_step_states()
    state.optim_resident = sum(c["optimizer_states"] for c in per_gpu.values()) - sum(state.first_optim.values())
    for w in walks:
        w.start()

    walk = _StepWalk(step, walks)
    walk_start = len(state.events)
    end_of_forward = walk.forward_pass()
    # NB: under a device_map a GPU with nothing to train still runs its layers' backward
    if trainable or (setup.device_map is not None and setup.device_map.trains):
        walk.backward_pass()
    step_point, first_step_point, step_start = walk.optimizer_step()

    per_gpu_totals = {m: {**per_gpu[m], "gradients": placing.gradients(m)} for m in modules}
    # The seed paper's Eq. 1: the four factors summed, per GPU, activations as kept for backward.
    seed_sum = sum(sum(c.values()) for c in per_gpu_totals.values()) + sum(end_of_forward.values())
    resident_blocks = [b for r in nodes for n in r.walk() for b in placing.resident_blocks(n)]
    states = [b for r in nodes for n in r.walk() for b in placing.state_blocks(n)]
    states += [round_up(b, ALLOCATOR_GRANULE) for b in once]
    first_step = walk.owner.first_step_allocations(once) if trainable else None
    untied = _untied_head(nodes, setup) if (p_div, setup.device_map, setup.pp) == (1, None, 1) else 0
    # NB: the allocator cannot hold less than is allocated, so where the allocated peak with the
    # device's overhead passes a probe's budget the verdict needs no replay
    bound = verdict_budget is not None and state.best.total + device_overhead(setup) > verdict_budget
    # Step 1 has no optimizer states before step() creates them; its step() makes them as it
    # goes (see optimizer_step._first_step_optimizer).
    first_point = max(state.first_point(), first_step_point, key=lambda p: p.total)
    if bound:
        reserved, oom, blocks = state.best.total, None, (0, 0)
    else:
        reserved, oom, bound, blocks = replay(setup, state, resident_blocks, states, walk_start, step_start, first_step, untied, verdict_budget is not None)
    return Estimate(
        peak=state.best,
        reserved=max(reserved, state.best.total),
        reserved_bound=bound,
        oom=oom,
        first_step=first_point,
        allocated=max(blocks[1], state.best.total),
        allocated_first_step=max(blocks[0], first_point.total),
        timeline=tuple(state.timeline),
        resident=per_gpu_totals,
        activations_end_of_forward=end_of_forward,
        seed_sum=seed_sum,
        not_modelled=_not_modelled(setup) + _paged_note(nodes, setup),
        trainable_params=trainable,
    )


def _per_gpu_estimates(nodes: tuple[Node, ...], setup: Setup) -> Estimate:
    """device_map: the step walked once per GPU, each with only its own layers
    (walks/device_map.py); the estimate of the GPU that needs the most, with every GPU's."""
    placement = device_map.place(nodes, setup)
    paths = tuple((n.inst.path, placement[id(n)]) for r in nodes for n in r.walk())
    dm = replace(setup.device_map, placement=paths, trains=_trainable_elements(nodes, setup) > 0)
    # NB: GPU 0 holds the batch (and the model's outputs) even with no layer of its own
    used = sorted({0, *placement.values()})
    per_gpu = tuple(replace(simulate(device_map.on_gpu(nodes, placement, g), replace(setup, device_map=replace(dm, gpu=g))), gpu=g) for g in used)
    # "fits" decides on the GPU that needs the most: the largest allocated, the largest reserved
    worst = max(per_gpu, key=lambda e: e.peak.total)
    oom = next((e.oom for e in per_gpu if e.oom is not None), None)
    return replace(
        worst,
        devices=per_gpu,
        trainable_params=sum(e.trainable_params for e in per_gpu),
        reserved=max(e.reserved for e in per_gpu),
        oom=oom,
        first_step=max((e.first_step for e in per_gpu), key=lambda p: p.total),
        allocated=max(e.allocated for e in per_gpu),
        allocated_first_step=max(e.allocated_first_step for e in per_gpu),
    )


def _per_gpu(step: Step, placing: Walk) -> dict:
    """Per module, what stays on this GPU as the placing walk puts it: the weights with the
    buffers, and the optimizer states."""
    per_gpu: dict = {}
    for root in step.nodes:
        walk = root.walk()
        buffers = sum(round_up(b, ALLOCATOR_GRANULE) for n in walk for b in n.cost.buffer_tensors)
        placed = [placing.resident(n) for n in walk]
        per_gpu[root.inst.module] = {"parameters": sum(p for p, _ in placed) + buffers, "optimizer_states": sum(o for _, o in placed)}
    return per_gpu


def _hooks(walks: list[Walk], name: str) -> list:
    """The walks' `name` hooks, only those a walk overrides (the others do nothing)."""
    return [getattr(w, name) for w in walks if getattr(type(w), name) is not getattr(Walk, name)]


class _StepWalk:
    """One training step walked layer by layer (the module's docstring), calling the hooks of
    the strategies' walks."""

    def __init__(self, step: Step, walks: list[Walk]) -> None:
        self.step, self.state, self.walks, self.placing = step, step.state, walks, walks[0]
        self.nodes = step.nodes
        # NB: not DeepSpeed's optimizer offload: the activations' (torch's saved-tensor hooks)
        self.act_offload = step.setup.activation_offloading
        self.held: list = []  # tensors the model's outputs keep until the forward ends
        self.returned: list | None = None  # in a checkpointing unit's first forward: until: layer
        # in a checkpointing unit's first forward: tensor -> the last layer that saves it
        # (`_scopes`), and layer -> the tensors alive until it has run
        self.scopes: dict[str, str] | None = None
        self.scoped: dict[str, list[str]] = {}
        # a checkpointing unit's locals (what it returned to itself, what its layers shared),
        # freed once what runs next has charged its input, the unit's output
        self.locals: list[str] = []
        self.order = forward_order(tuple(n.inst for n in self.nodes))
        self.before_layer_forward = _hooks(walks, "before_layer_forward")
        self.after_layer_forward = _hooks(walks, "after_layer_forward")
        self.while_running = _hooks(walks, "while_running")
        self.after_running = _hooks(walks, "after_running")
        self.before_layer_backward = _hooks(walks, "before_layer_backward")
        self.after_layer_backward = _hooks(walks, "after_layer_backward")
        target = step.setup.target
        self.workspace_blocks = target.workspace_allocations
        # NB: with nothing trainable, no backward: the forward's thread alone runs GEMMs
        self.workspace_threads = target.gemm_threads if step.trainable else 1
        self.placed: set[int] = set()

    def _workspace(self, thread: int) -> None:
        """Thread `thread`'s cuBLAS and cuBLASLt workspaces, made by its first GEMM after that
        GEMM's output (0: the forward's thread; 1: autograd's, which runs backward and a
        checkpointing unit's recomputation), as the GPU histories show them: kept for good."""
        if thread < self.workspace_threads and thread not in self.placed:
            self.placed.add(thread)
            for i, size in enumerate(self.workspace_blocks):
                self.state.events.append((("workspace", thread, i), size))

    def forward_pass(self) -> dict[str, int]:
        """The forward in `expand.forward_order`; the saved bytes per module at its end."""
        for w in self.walks:
            w.before_forward()
        for i, lo, hi in self.order:
            # NB: offloaded, a saved tensor lives on the device only while the code that made it
            # still holds it: as in a checkpointing unit's first forward, nothing is kept
            self.forward(self.nodes[i], {}, keep=not self.act_offload, span=(lo, hi))
        self._free_locals()
        for w in self.walks:
            w.after_forward()
        self.state.release(self.held)
        return dict(self.state.live_by_module)

    def backward_pass(self) -> None:
        """The backward in the reverse of the forward's order, then the end of backward."""
        for w in self.walks:
            w.before_backward()
        through = sum(w.through_backward() for w in self.walks)
        stack = {self.step.modules[-1]: through} if through else {}
        for i, lo, hi in reversed(self.order):
            self.backward(self.nodes[i], stack, span=(lo, hi))
        for w in self.walks:
            w.after_backward()
        # the loop drops the loss (and backward() its seed gradient) once backward returns
        self.state.free_pinned([name for r in self.nodes for n in r.walk() for name in n.cost.pinned])
        for w in self.walks:
            w.before_step()

    def _running(self, node: Node) -> int:
        extra = 0
        for hook in self.while_running:
            extra += hook(node)
        return extra

    def _ran(self, node: Node) -> None:
        for hook in self.after_running:
            hook(node)

    def _free_locals(self) -> None:
        self.state.free_pinned(self.locals)
        self.locals = []

    def _returned(self, node: Node, name: str, keep: bool) -> None:
        """A child's output that a later sibling (not the next) reads and saves exists from the
        child's end (LlamaMLP's act_out, alive while up_proj runs), not from its saver's start;
        in a checkpointing unit's first forward, until its last saver has run."""
        state = self.state
        if name in state.live:
            return
        size = next((b for n in node.walk() for saved, b in n.cost.saved if saved == name), None)
        if size is None:
            return
        if keep:
            state.charge(node.inst.module, [(name, size)], kept=True)
        elif self.scopes is not None and name in self.scopes:
            self._until_last_saver(node.inst.module, [(name, size)])

    def _until_last_saver(self, module: str, tensors: list) -> None:
        """In a checkpointing unit's first forward: `tensors` exist from now until the last
        layer that saves each (`_scopes`) has run."""
        self.state.charge(module, tensors)
        for name, _ in tensors:
            self.scoped.setdefault(self.scopes[name], []).append(name)

    def _shared(self, inst, pieces: tuple) -> tuple:
        """A checkpointing unit's first forward keeps nothing for backward; a tensor that later
        layers save too (the normed input q, k and v read) is one tensor from its first reader
        until its last has run, not one per reader. The pieces left to the leaf itself."""
        live = self.state.live
        self._until_last_saver(inst.module, [(name, b) for name, b in pieces if name not in live and self.scopes.get(name, inst.path) != inst.path])
        return tuple((name, b) for name, b in pieces if name not in live)

    def forward(self, node: Node, stack: Mapping[str, int], keep: bool, phase: str = "forward", span: tuple[int, int] | None = None) -> None:
        """The forward of `node`; phase "backward" is a checkpointing unit's recomputation.
        `span` runs only those of a root's children (expand.forward_order); the root's own
        tensors are charged with its first child."""
        inst, state = node.inst, self.state
        lo, hi = span or (0, len(node.children))
        first = phase == "forward"
        unit = None
        if first and inst.checkpointed and keep:
            # NB: the unit's inputs exist before it runs (the previous layer's output), so
            # they count during its first forward, not from its end; inside it nothing is kept
            state.charge(inst.module, node.cost.checkpoint, kept=True)
            keep = False
            unit = self.returned = []
            self.scopes = _scopes(node)
        if first:
            for hook in self.before_layer_forward:
                hook(node, stack)
        mark = len(state.events)
        if lo > 0:
            pass  # NB: the rest of a split root: its own tensors were charged with its first part
        elif keep:
            state.charge(inst.module, node.cost.saved, kept=True)
        elif first and node.cost.pinned:
            # NB: what the training loop holds (the loss) is no saved tensor: offloading or a
            # checkpointing unit's first forward keeps it all the same
            state.charge(inst.module, [x for x in node.cost.saved if x[0] in node.cost.pinned], kept=True)
        if first and lo == 0:
            state.charge(inst.module, node.cost.held)
            self.held.extend(node.cost.held)
            if not keep and node.cost.cached and not self.act_offload:
                # NB: autocast's cast cache keeps a trainable weight's 16-bit copy until the
                # forward ends, though a checkpointing unit keeps none of its saved tensors
                state.charge(inst.module, node.cost.cached)
                self.held.extend(node.cost.cached)
            if not keep and node.cost.returned and self.returned is not None:
                # NB: what a module returns to the layer holding it (eager attention's weights)
                # lives until the checkpointing unit returns, though the unit keeps nothing
                state.charge(inst.module, node.cost.returned)
                self.returned.extend(node.cost.returned)
        if self.locals and first:
            # NB: a module's output is made before its locals go (the residual add that
            # becomes the next unit's input runs while the unit still holds its attention
            # weights): the unit before frees them only now
            self._free_locals()
        # NB: inside a checkpointing unit's first forward nothing is kept, but a layer's
        # would-be saved tensors still exist while it runs.
        t = push(stack, inst.module, node.cost.transient_forward + self._running(node))
        if not node.children:
            cached = {name for name, _ in node.cost.cached} if phase == "forward" and not self.act_offload else set()
            if node.cost.returned and self.returned is not None:
                cached.update(name for name, _ in node.cost.returned)
            pieces = () if keep else tuple((name, b) for name, b in node.cost.saved if name not in cached)
            if pieces and first and self.scopes is not None:
                pieces = self._shared(inst, pieces)
            unkept = sum(b for _, b in pieces)
            order = node.cost.allocations_forward
            if order:
                _defer(state.events, mark, {name for op, name, _ in order if op == "saved"})
            state.observe(phase, inst.path, push(t, inst.module, unkept), (inst.module, node.cost.transient_forward), order, pieces=pieces)
            if inst.formula.gemm:
                self._workspace(0 if first else 1)
            self._ran(node)
        held = self.state.hold(inst.module, t.get(inst.module, 0) - stack.get(inst.module, 0)) if node.children else None
        for c in node.children[lo:hi]:
            self.forward(c, t, keep, phase)
            if c.inst.output is not None:
                self._returned(node, c.inst.output, keep)
        self.state.unhold(held)
        if self.scoped:
            state.free_pinned(self.scoped.pop(inst.path, ()))
        if unit is not None:
            self.locals = [name for name, _ in unit] + [name for names in self.scoped.values() for name in names]
            self.returned, self.scopes, self.scoped = None, None, {}
        if first:
            for hook in self.after_layer_forward:
                hook(node)

    def backward(self, node: Node, stack: Mapping[str, int], span: tuple[int, int] | None = None) -> None:
        """The backward of `node`; `span` as in `forward`: a split root's gradients appear and
        its own tensors are freed with its first child's backward, the last of its parts."""
        inst, state = node.inst, self.state
        lo, hi = span or (0, len(node.children))
        if lo > 0:
            t = push(stack, inst.module, node.cost.transient_backward)
            for c in reversed(node.children[lo:hi]):
                self.backward(c, t)
            return
        for hook in self.before_layer_backward:
            hook(node, stack)
        # NB: a checkpointing unit's backward transient (the gradient of its output, which
        # triggers the recomputation) is alive while it recomputes
        grad_out = state.hold(inst.module, node.cost.transient_backward) if node.children and inst.checkpointed else None
        if inst.checkpointed:
            self.forward(node, push(stack, inst.module, node.cost.transient_backward), keep=True, phase="backward")
        t = push(stack, inst.module, node.cost.transient_backward + self._running(node) + self._unpacked(node))
        held = state.hold(inst.module, t.get(inst.module, 0) - stack.get(inst.module, 0) - (grad_out[1] if grad_out else 0)) if node.children else None
        for c in reversed(node.children[:hi]):
            self.backward(c, t)
        order = node.cost.allocations_backward
        if not node.children and order and order[0][:2] == ("alloc", "grad_out") and order[0][2]:
            # NB: the incoming gradient exists before the layer's weight gradients are made
            # (the next layer's backward made it): the replay allocates it first
            state.incoming_grad(order[0][2])
        if node.cost.gradients:
            # NB: a gradient computed in forward (a fused loss) was live as a saved tensor;
            # it becomes the .grad here rather than being allocated beside it
            state.free(inst.path, [(name, 0) for name in node.cost.handover])
            self.placing.layer_gradients(node, t)
        if not node.children and inst.formula.gemm and (node.cost.gradients or node.cost.transient_backward):
            self._workspace(1)
        state.unhold(held)
        state.unhold(grad_out)
        if not node.children:
            state.observe("backward", inst.path, t, (inst.module, node.cost.transient_backward), node.cost.allocations_backward, backward=True)
            self._ran(node)
        state.free(inst.path, [x for x in node.cost.saved + node.cost.checkpoint if x[0] not in node.cost.pinned])
        for hook in self.after_layer_backward:
            hook(node, stack)

    def _unpacked(self, node: Node) -> int:
        """Offloaded activations: the device copies a leaf's backward unpacks from host memory,
        its saved tensors less those handed over as gradients (each node unpacks its own copy,
        so tensors shared by name count once per leaf)."""
        if not self.act_offload or node.children:
            return 0
        return sum(round_up(b, ALLOCATOR_GRANULE) for name, b in node.cost.saved if name not in node.cost.handover + node.cost.pinned)

    def optimizer_step(self) -> tuple[Point, Point, int]:
        """The steady step's optimizer point, step 1's, and where the step's events start. The
        walks are asked from the last: the first that answers steps the optimizer."""
        state = self.state
        for owner in reversed(self.walks):
            transient = owner.optimizer_step()
            if transient is not None:
                break
        step_start = len(state.events)
        state.observe("optimizer", "optimizer.step", transient)
        self.owner = owner
        events = owner.step_allocations()
        if events is not None:
            # the replay sees the step tensor by tensor, as torch's optimizer allocates it
            del state.events[step_start:]
            state.events.extend(events)
        step = state._point("optimizer", "optimizer.step", state.level + sum(transient.values()), transient)
        return step, owner.first_step(step, transient), step_start


def _untied_head(nodes: tuple[Node, ...], setup: Setup) -> int:
    """Bytes of the output embedding's own weight that building a model with tied embeddings
    allocates and drops: `PreTrainedModel.__init__` builds lm_head (an nn.Linear allocates its
    [vocab, hidden] weight on the device) and `post_init` -> `tie_weights` points it at the
    input embedding's, freeing it. The caching allocator keeps the freed segment (a GPU's
    allocator history shows the allocation and the free one after the other, after the last
    layer's weights; compiler/measure/harness.py `_untied_head` traces the same). Only where
    the whole model is built on each GPU: no sharded parameters, device_map or pipeline stage."""
    for root in nodes:
        for n in root.walk():
            scope = n.inst.scope
            if n.inst.formula.layer_type == "embedding" and scope.get("shared_weight"):
                return scope["vocab"] * scope["dim"] * scope["bytes"]["param"]
    return 0


def _scopes(unit: Node) -> dict[str, str]:
    """Each tensor a layer inside checkpointing unit `unit` saves -> the path of the last
    layer that saves it."""
    out: dict[str, str] = {}

    def walk(node: Node) -> None:
        for c in node.children:
            for name, _ in c.cost.saved:
                out[name] = c.inst.path
            walk(c)

    walk(unit)
    return out


def _defer(events: list, mark: int, names: set[str]) -> None:
    """Take the allocations of the saved tensors `names` made since `mark` out of `events`:
    the leaf's allocation order makes them where its operators do."""
    keys = {("tensor", name) for name in names}
    events[mark:] = [e for e in events[mark:] if e[0] not in keys or e[1] is None]


def _not_modelled(setup: Setup) -> tuple[str, ...]:
    out = []
    if setup.fsdp is not None:
        if setup.dp > 1:
            out.append(
                "FSDP2 units other than the decoder/encoder layers and the root (accelerate also wraps CLIPVisionEmbeddings; counted here in the root, which stays gathered longer: an over-estimate)"
            )
    elif setup.dp > 1 and setup.zero == 0:
        out.append("DDP gradient buckets (a second copy of the gradients unless gradient_as_bucket_view)")
    if setup.zero in (1, 2):
        if _zero12_active(setup):
            out.append("a layer's 16-bit gradient waiting for its bucket copy, except when it triggers a reduction or is too large for the bucket")
        else:
            out.append("DeepSpeed's flat-buffer alignment padding and the moment a parameter's 16-bit gradient waits before its bucket copy")
            if setup.deepspeed is not None and setup.deepspeed.comm_bytes not in (None, setup.bytes["grad"]):
                out.append("ZeRO-1/2's copy of each bucket in communication_data_type (stage_1_and_2.py, allreduce_bucket)")
    elif setup.zero == 3:
        out.append(
            "DeepSpeed's flat-buffer alignment padding, and a layer's 16-bit gradient waiting for its bucket copy "
            "except when it triggers a bucket's reduce-scatter"
        )
    if setup.tp > 1:
        out.append("tensor-parallel communication buffers (all-gather / reduce-scatter outputs beyond the layers' own tensors)")
    if setup.pp > 1:
        out.append("pipeline send/receive buffers of the stage boundary's activations and gradients ([s, b, hidden] each)")
    if setup.zero >= 3 and setup.deepspeed is not None and (setup.dp > 1 or setup.deepspeed.offload_param != "none"):
        out.append(
            "ZeRO-3's first step records the fetch trace and neither prefetches nor keeps layers for reuse; "
            "the estimate walks the traced (later) steps' fetches in both"
        )
    if setup.quantization is not None:
        # NB: peft/utils/other.py, prepare_model_for_kbit_training: every fp16/bf16 parameter
        # left unquantized is cast to fp32 (LLaVA's train.py casts some back afterwards)
        out.append(
            "peft prepare_model_for_kbit_training's fp32 copy of the unquantized 16-bit weights (norms, embeddings, lm_head), "
            "and bitsandbytes' outlier columns (LLM.int8() threshold 6.0)"
        )
    return tuple(out)


def _paged_note(nodes, setup: Setup) -> tuple[str, ...]:
    paged = _paged_bytes(nodes, setup)
    if not paged:
        return ()
    return (
        f"bitsandbytes paged optimizer states, {paged:,} B in CUDA unified memory (cudaMallocManaged): outside "
        "max_memory_allocated and reserved, resident on the GPU until memory runs short, then paged to host memory",
    )
