"""Stage 6, simulate: walk one training step and find its peak.

Contract: `simulate(nodes, setup, gpus)` returns an `Estimate`: the allocated-bytes timeline
of a steady-state step (forward, loss, backward, optimizer step, in that order), its peak with
the phase, layer and a module x category breakdown at that moment, the same for the first
step (no optimizer states until `step()` creates them), the seed paper's plain four-factor
sum, and the allocator's `reserved` and the device's `nvidia-smi` figures derived from the
peak. The walk, per DESIGN.md:

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .evaluate import Node, first_charges, trained
from ..memory import allocator
from ..memory.allocator import Allocator, OutOfMemory, OutOfMemoryError, allocation_size, round_size
from .expand import forward_order
from ..memory import optimizers
from .resolve import DEEPSPEED_STATES_AT_INIT, ZERO12_ALIGNMENT, Constant, Setup, gpu_catalog

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "transient")
WORKSPACE = "cublas"  # the breakdown row of the cuBLAS/cuBLASLt workspaces
_ZERO = dict.fromkeys(CATEGORIES, 0)
DEEPSPEED = "deepspeed"  # the breakdown row of DeepSpeed's gradient buckets
DEEPSPEED_RS = "deepspeed-reduce-scatter"  # breakdown row: ZeRO-3's reduce-scatter copy of a full bucket
ZERO3_KEPT = "zero3-kept"  # breakdown row: ZeRO-3 layers kept gathered for their reuse (stage3_max_reuse_distance)
ZERO12_GRADS = "zero-grad-partition"  # breakdown row: ZeRO-1/2's grads_in_partition, from the first bucket reduction
ZERO12_WAIT = "zero-large-grad"  # breakdown row: a gradient too large for ZeRO-1/2's bucket, whole until it is reduced
FSDP_GATHER = "fsdp-gather"  # breakdown row: FSDP2's gathered parameters and all-gather outputs
FSDP_REDUCE = "fsdp-reduce"  # breakdown row: FSDP2's reduce-scatter inputs
PROBE = ("probe",)  # replay event: an allocation freed at once (Allocator.probe)
PIPELINE = "pipeline"  # the breakdown row of the other in-flight micro-batches' activations (1F1B)
ALLOCATOR_GRANULE = allocator.MIN_BLOCK  # kMinBlockSize: every request rounds up to it
_ALLOCATOR = "c10/cuda/CUDACachingAllocator.cpp"
ALLOCATOR_CONSTANTS = (
    Constant("kMinBlockSize", allocator.MIN_BLOCK, "B", f"{_ALLOCATOR}: every request rounds up to it (allocated)"),
    Constant("kSmallSize", allocator.SMALL_SIZE, "B", f"{_ALLOCATOR}: requests up to it come from the small pool's 2 MiB segments (reserved)"),
    Constant("kLargeBuffer", allocator.LARGE_BUFFER, "B", f"{_ALLOCATOR}: the segment of a request under kMinLargeAlloc (reserved)"),
    Constant("kMinLargeAlloc", allocator.MIN_LARGE_ALLOC, "B", f"{_ALLOCATOR}: requests of this size and more get their own segment (reserved)"),
    Constant("kRoundLarge", allocator.ROUND_LARGE, "B", f"{_ALLOCATOR}: such a segment rounds up to a multiple of it (reserved)"),
)


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Point:
    phase: str  # forward | backward | optimizer
    path: str  # the layer running, or "optimizer.step"
    total: int
    breakdown: Mapping[str, Mapping[str, int]]  # module -> category -> bytes


@dataclass(frozen=True)
class Estimate:
    peak: Point  # steady state
    reserved: int  # the caching allocator's segments, highest over two steps replayed (see _replay)
    first_step: Point
    timeline: tuple[tuple[str, str, int], ...]  # (phase, path, allocated) per event, steady state
    resident: Mapping[str, Mapping[str, int]]  # module -> parameters/gradients/optimizer_states/buffers, per GPU
    activations_end_of_forward: Mapping[str, int]  # module -> saved bytes alive when the loss is computed
    seed_sum: int  # parameters + gradients + optimizer states + activations, summed (seed paper Eq. 1)
    not_modelled: tuple[str, ...]
    trainable_params: int  # elements, all ranks
    oom: OutOfMemory | None = None  # the allocation that fails on `setup.gpu`, if one does


@dataclass
class _State:
    modules: tuple[str, ...]
    resident: dict  # module -> {parameters (buffers included), optimizer_states}, per GPU
    owner: dict  # tensor -> owning path
    grads: dict = field(default_factory=dict)  # module -> bytes
    live: dict = field(default_factory=dict)  # tensor -> (module, bytes)
    live_by_module: dict = field(default_factory=dict)
    kept: set = field(default_factory=set)  # names saved for backward (not only held)
    buffers: dict = field(default_factory=dict)  # system buffers (DeepSpeed buckets) -> bytes
    best: Point | None = None
    best_first: tuple | None = None
    timeline: list = field(default_factory=list)

    level: int = 0  # resident + workspaces + gradients + live saved tensors, kept up to date
    workspace: int = 0  # cuBLAS/cuBLASLt workspaces of a steady-state step
    first_forward_workspace: int = 0  # step 1's forward has run GEMMs on one thread only
    optim_resident: int = 0  # optimizer bytes that appear only at the first step()
    first_optim: dict = field(default_factory=dict)  # module -> optimizer bytes already there in step 1
    # The step's allocations and frees in order, (key, bytes) and (key, None), for the
    # caching allocator's replay (compiler.memory.allocator); see `replay_events`
    events: list = field(default_factory=list)
    buffer_keys: dict = field(default_factory=dict)  # buffer name -> [(key, bytes)] live, oldest first
    grad_keys: dict = field(default_factory=dict)  # layer path -> [(key, bytes)] live
    serial: int = 0

    def _new_key(self, kind: str, name: str) -> tuple:
        self.serial += 1
        return (kind, name, self.serial)

    def add_grad(self, module: str, path: str, size: int) -> None:
        """A layer's gradients appear (one allocation)."""
        if size:
            key = self._new_key("grad", path)
            self.events.append((key, size))
            self.grad_keys.setdefault(path, []).append((key, size))
            self.grads[module] = self.grads.get(module, 0) + size
            self.level += size

    def drop_grad(self, module: str, path: str, size: int) -> None:
        if size:
            for key, _ in self.grad_keys.pop(path, ()):
                self.events.append((key, None))
            self.grads[module] -= size
            self.level -= size

    def drop_grads(self) -> None:
        """Every gradient goes (zero_grad(set_to_none=True), or ZeRO-1's reduction)."""
        for keys in self.grad_keys.values():
            for key, _ in keys:
                self.events.append((key, None))
        self.grad_keys.clear()
        for m in list(self.grads):
            self.level -= self.grads[m]
            self.grads[m] = 0

    def charge(self, module: str, tensors, kept: bool = False) -> None:
        for name, size in tensors:
            if kept:
                self.kept.add(name)
            if name not in self.live:
                size = round_up(size, ALLOCATOR_GRANULE)
                if size:
                    self.events.append((("tensor", name), size))
                self.live[name] = (module, size)
                self.live_by_module[module] = self.live_by_module.get(module, 0) + size
                self.level += size

    def add_buffer(self, name: str, size: int) -> None:
        """A system buffer (not a module's) alive from now on, shown in its own breakdown row."""
        if size:
            key = self._new_key("buffer", name)
            self.events.append((key, size))
            self.buffer_keys.setdefault(name, []).append((key, size))
            self.buffers[name] = self.buffers.get(name, 0) + size
            self.level += size

    def drop_buffer(self, name: str, size: int) -> None:
        if size:
            self._free_buffer(name, size)
            self.buffers[name] -= size
            self.level -= size
            if not self.buffers[name] and name in (DEEPSPEED_RS, ZERO3_KEPT, ZERO12_WAIT):
                del self.buffers[name]  # NB: a transient row shows only while it holds bytes

    def _free_buffer(self, name: str, size: int) -> None:
        """Free the allocation of buffer `name` made with `size` (the latest such), or the
        latest ones until `size` is freed."""
        keys = self.buffer_keys.get(name, [])
        for i in range(len(keys) - 1, -1, -1):
            if keys[i][1] == size:
                self.events.append((keys.pop(i)[0], None))
                return
        while size > 0 and keys:
            key, nbytes = keys.pop()
            self.events.append((key, None))
            size -= nbytes

    def _drop(self, name: str) -> None:
        module, size = self.live.pop(name)
        if size:
            self.events.append((("tensor", name), None))
        self.live_by_module[module] -= size
        self.level -= size

    def release(self, tensors) -> None:
        """Free the forward's held outputs, except those something saved for backward."""
        for name, _ in tensors:
            if name in self.live and name not in self.kept:
                self._drop(name)

    def free(self, path: str, tensors) -> None:
        """Free the tensors `path` charged, once its backward has run."""
        for name, _ in tensors:
            if self.owner.get(name) == path and name in self.live:
                self._drop(name)

    def free_pinned(self, names) -> None:
        for name in names:
            if name in self.live:
                self._drop(name)

    def observe(self, phase: str, path: str, transient: Mapping[str, int], own: tuple[str, int] = ("", 0)) -> None:
        """`own`: the running leaf's module and its own transient bytes (inside that module's
        entry of `transient`, with the transients of the composites around it)."""
        # NB: a transient is allocated for the moment observed and freed after it: the running
        # leaf's own as one allocation, the rest of each module's stack as another
        module, mine = own
        keys = []
        for m, size in transient.items():
            parts = (size - mine, mine) if m == module else (size,)
            keys += [(self._new_key("transient", m), b) for b in parts if b > 0]
        if len(keys) == 1:
            self.events.append((PROBE, keys[0][1]))
        else:
            self.events.extend(keys)
            self.events.extend((key, None) for key, _ in keys)
        total = self.level + sum(transient.values())
        self.timeline.append((phase, path, total))
        if self.best is None or total > self.best.total:
            self.best = self._point(phase, path, total, transient)
        first = total - self.optim_resident - (self.workspace - self.first_forward_workspace if phase == "forward" else 0)
        if phase != "optimizer" and (self.best_first is None or first > self.best_first[2]):
            # NB: a snapshot, made into a Point once at the end: this branch runs on most
            # forward events.
            self.best_first = (phase, path, first, dict(self.grads), dict(self.live_by_module), transient, dict(self.buffers))

    def first_point(self) -> Point:
        phase, path, total, grads, live, transient, buffers = self.best_first
        state = _State(self.modules, self.resident, self.owner, grads, {}, live)
        state.buffers = buffers
        state.first_optim = self.first_optim
        state.workspace = self.first_forward_workspace if phase == "forward" else self.workspace
        point = state._point(phase, path, total, transient)
        for m, cats in point.breakdown.items():
            cats["optimizer_states"] = self.first_optim.get(m, 0)
        return point

    def _point(self, phase: str, path: str, total: int, transient: Mapping[str, int]) -> Point:
        return Point(phase, path, total, self._breakdown(transient))

    def _breakdown(self, transient: Mapping[str, int]) -> dict:
        out = {}
        # NB: cuBLAS workspaces belong to no module; a row of their own keeps the sum exact.
        for m in self.modules:
            r = self.resident.get(m, {})
            out[m] = {
                "parameters": r.get("parameters", 0),
                "gradients": self.grads.get(m, 0),
                "optimizer_states": r.get("optimizer_states", 0),
                "activations": self.live_by_module.get(m, 0),
                "transient": transient.get(m, 0),
            }
        out[WORKSPACE] = {**_ZERO, "transient": self.workspace}
        for name, size in self.buffers.items():
            category = "parameters" if name in (FSDP_GATHER, ZERO3_KEPT) else "activations" if name == PIPELINE else "gradients"
            out[name] = {**_ZERO, category: size}
        return out


def _blocks(node: Node, setup: Setup, p_div: int, g_div: int, o_div: int) -> tuple[int, int, int]:
    """Per-GPU allocated bytes of one layer's weights, gradients and optimizer states.

    Unsharded, every tensor is its own allocation, rounded to the allocator's granule: a
    weight, its gradient, and with a master-weight optimizer its fp32 master copy and each
    state. Sharded by ZeRO, they live in flat partitions: the total divided by the ranks.
    """
    c = node.cost
    mine, mine_shapes = trained(node.inst, c.param_tensors, c.param_shapes, c.param_names)
    elements = [t // setup.bytes["param"] for t in mine]
    if _offloaded(setup):
        # NB: DeepSpeed's optimizer offload keeps the fp32 partition, its gradient and the
        # states in host memory; only the 16-bit weights stay: whole under ZeRO-1/2, the flat
        # partition under ZeRO-3 (stage3.py, fp16_partitioned_groups_flat), none with
        # offload_param (param_groups_fp16_flat_cpu_memory, pinned host memory)
        if setup.zero == 3:
            return (0 if _params_offloaded(setup) else _div(c.parameters, p_div)) + _persistent_bytes(c, setup, p_div), 0, 0
        return sum(round_up(t, ALLOCATOR_GRANULE) for t in c.param_tensors), 0, 0
    params = sum(round_up(t, ALLOCATOR_GRANULE) for t in c.param_tensors) if p_div == 1 else _div(c.parameters, p_div) + _persistent_bytes(c, setup, p_div)
    if not c.gradients:
        grads = 0
    elif g_div == 1:
        grads = sum(round_up(e * setup.bytes["grad"], ALLOCATOR_GRANULE) for e in elements)
    else:
        grads = _div(c.gradients, g_div)
    if not c.optimizer_states:
        states = 0
    elif o_div == 1:
        states = sum(
            (round_up(e * setup.master_bytes, ALLOCATOR_GRANULE) if setup.master_bytes else 0)
            + sum(round_up(s.nbytes, ALLOCATOR_GRANULE) for s in _states(setup, e, shape) if not s.paged)
            for e, shape in zip(elements, mine_shapes)
        )
    else:
        states = _div(c.optimizer_states, o_div)
    return params, grads, states


def _persistent(setup: Setup, tensor_bytes: int) -> bool:
    """ZeRO-3 keeps a parameter with fewer than stage3_param_persistence_threshold elements
    gathered on every rank (deepspeed/runtime/zero/parameter_offload.py,
    DeepSpeedZeRoOffload.mark_persistent_parameters: ds_persist; partitioned_param_coordinator.py,
    __params_to_release skips ds_persist; stage3.py, _post_step gathers them again)."""
    ds = setup.deepspeed
    return ds is not None and setup.zero == 3 and tensor_bytes // setup.bytes["param"] < ds.persistence_threshold


def _persistent_bytes(c, setup: Setup, p_div: int) -> int:
    """The whole 16-bit copies of a layer's persistent parameters, kept beside their partition
    (the flat 16-bit partition still holds their slice for the optimizer), per GPU."""
    if p_div == 1 and not _params_offloaded(setup):
        return 0  # NB: nothing is partitioned: the parameter is whole already
    return sum(round_up(t, ALLOCATOR_GRANULE) for t in c.param_tensors if _persistent(setup, t))


def _gathered_bytes(c, setup: Setup, p_div: int, host_copy: bool = False) -> int:
    """What gathering a ZeRO-3 layer adds to its partition: the whole 16-bit weights of its
    parameters that are not persistent (those are gathered already), less the local slice,
    which all_gather_coalesced gathers into place (partition_parameters.py). With
    offload_param the partition is in host memory: the whole weights, plus (`host_copy`) the
    all-gather's GPU copy of the host slice."""
    if _params_offloaded(setup):
        return sum(t + (_div(t, p_div) if host_copy else 0) for t in c.param_tensors if not _persistent(setup, t))
    return sum(t - _div(t, p_div) for t in c.param_tensors if not _persistent(setup, t))


def _states(setup: Setup, elements: int, shape) -> tuple:
    return optimizers.states(setup.optimizer, elements, shape, setup.state_bytes)


def _paged_bytes(nodes, setup: Setup) -> int:
    """bitsandbytes' paged states: CUDA unified memory (cudaMallocManaged), never in
    torch.cuda.max_memory_allocated."""
    if not setup.optimizer.paged:
        return 0
    return sum(s.nbytes for e, shape in _trainable_tensors(nodes, setup) for s in _states(setup, e, shape) if s.paged)


def _shards(setup: Setup) -> tuple[int, int, int]:
    """Divisors of (parameters, gradients, optimizer states) per GPU under ZeRO."""
    dp, z = setup.dp, setup.zero
    if setup.fsdp is not None:
        return (1, 1, 1)  # NB: FSDP2 shards per parameter; see _FsdpPlan
    return (dp if z >= 3 else 1, dp if z >= 2 else 1, dp if z >= 1 else 1)


def simulate(nodes: tuple[Node, ...], setup: Setup) -> Estimate:
    p_div, g_div, o_div = _shards(setup)
    modules = tuple(n.inst.module for n in nodes)
    blocks = {id(n): _blocks(n, setup, p_div, g_div, o_div) for r in nodes for n in r.walk()}
    plan = _FsdpPlan(nodes, setup) if setup.fsdp is not None else None
    resident: dict = {}
    per_gpu: dict = {}
    for root in nodes:
        walk = list(root.walk())
        resident[root.inst.module] = {
            "parameters": sum(n.cost.parameters for n in walk),
            "gradients": sum(n.cost.gradients for n in walk),
            "optimizer_states": sum(n.cost.optimizer_states for n in walk),
            "buffers": sum(n.cost.buffers for n in walk),
        }
        buffers = sum(round_up(b, ALLOCATOR_GRANULE) for n in walk for b in n.cost.buffer_tensors)
        if plan is not None:
            sharded = [plan.resident(n, setup) for n in walk]
            per_gpu[root.inst.module] = {"parameters": sum(p for p, _ in sharded) + buffers,
                                         "optimizer_states": sum(o for _, o in sharded)}
            continue
        per_gpu[root.inst.module] = {
            "parameters": sum(blocks[id(n)][0] for n in walk) + buffers,
            "optimizer_states": sum(blocks[id(n)][2] for n in walk),
        }
    tensors = _trainable_tensors(nodes, setup)
    once = optimizers.once(setup.optimizer, [e for e, _ in tensors])
    if once:
        # NB: optimizer-wide tensors (bitsandbytes' quantile maps) belong to no layer; shown
        # with the first module that trains.
        first = next(r.inst.module for r in nodes if any(n.cost.optimizer_states for n in r.walk()))
        per_gpu[first]["optimizer_states"] += sum(round_up(b, ALLOCATOR_GRANULE) for b in once)
        resident[first]["optimizer_states"] += sum(once)
    state = _State(modules, per_gpu, first_charges(nodes))
    trainable = _trainable_elements(nodes, setup)
    # NB: with nothing trainable there is no backward (and no optimizer step) to walk.
    state.workspace = (setup.target.gemm_threads if trainable else 1) * setup.target.workspace
    state.first_forward_workspace = setup.target.workspace
    state.level = sum(sum(c.values()) for c in per_gpu.values()) + state.workspace
    # DeepSpeed's offload staging buffer exists from the engine's construction on
    offload = _offload_buffers(setup, _largest_trainable_tensor(nodes, setup), len(tensors))
    state.add_buffer(DEEPSPEED, offload[0])
    state.first_optim = _first_step_resident_optimizer(nodes, setup, o_div) if plan is None else {}
    state.optim_resident = sum(c["optimizer_states"] for c in per_gpu.values()) - sum(state.first_optim.values())
    zero3 = setup.deepspeed is not None and setup.zero == 3 and plan is None
    # ZeRO-3 allocates the whole gradient partition at initialization (stage3.py,
    # _setup_for_real_optimizer: grad_partitions_flat_buffer, torch.zeros of every parameter's
    # partition_numel in gradient_accumulation_dtype, the model's 16-bit dtype under ZeRO:
    # runtime/engine.py, get_data_types) and keeps it; with optimizer offload it is in host memory.
    # NB: a config's data_types.grad_accum_dtype is not read.
    grads_resident = zero3 and not _offloaded(setup) and trainable > 0
    # ZeRO-1/2 (contiguous_gradients, optimizer on the GPU): a gradient leaves autograd for the
    # bucket as it appears (ZeRO-2, or ZeRO-1 with overlap_comm: process_gradients) or after
    # backward (ZeRO-1: engine.backward -> reduce_gradients); the rank's gradient partition is
    # one allocation (zero12_grads_in_partition)
    zero12 = _zero12_active(setup) and plan is None and trainable > 0
    zero12_hooked = zero12 and (setup.zero == 2 or setup.deepspeed.overlap_comm)
    zero12_part = round_up(zero12_grads_in_partition(setup, stepped_tensors(nodes, setup)) * setup.bytes["grad"],
                           ALLOCATOR_GRANULE) if zero12 else 0
    bucket12 = _Zero12Bucket(setup) if zero12 else None
    if grads_resident:
        for root in nodes:
            state.add_grad(root.inst.module, f"{root.inst.module} (gradient partition)", sum(blocks[id(n)][1] for n in root.walk()))
    fs = _FsdpWalk(plan, state, blocks) if plan is not None else None

    offload_param = setup.zero == 3 and _params_offloaded(setup)
    gathering = zero3 and (p_div > 1 or offload_param)
    # ZeRO-3's reuse: a layer used again within stage3_max_reuse_distance elements stays gathered
    trace = _zero3_trace(nodes, setup) if gathering else []
    keep_after = _reuse_kept(trace, setup.deepspeed.max_reuse_distance) if gathering else ()
    kept: dict = {}  # id(node) -> bytes kept gathered since its last use
    cursor = [0, None]  # next trace position; the leaf now running (its position), if kept after it
    gathered: dict = {}  # id(leaf) -> (bytes its gather adds while it runs, bytes kept after it)
    ds, pb = setup.deepspeed, setup.bytes["param"]
    # _prefetch_bytes, unrolled: the whole prefetch bucket while the gathered elements leave room
    full_prefetch = _prefetch_bytes(setup, 0) if gathering else 0
    room = ds.max_live_parameters - ds.prefetch_bucket if gathering else 0

    def gather(node: Node) -> int:
        # ZeRO-3 gathers a layer's full weights while it runs, and prefetches the next ones.
        # NB: a ModulesToSaveWrapper's original_module never runs: nothing is gathered
        if node.children or not gathering or node.inst.idle:
            return 0
        sizes = gathered.get(id(node))
        if sizes is None:
            # NB: with offload_param the all-gather's input is a GPU copy of the host partition
            # (partition_parameters.py, all_gather_coalesced: ds_tensor.to(device)); counted
            # while the layer runs (an upper bound: it is freed once the all-gather is issued)
            sizes = gathered[id(node)] = (_gathered_bytes(node.cost, setup, p_div, host_copy=True), _gathered_bytes(node.cost, setup, p_div))
        if node.cost.parameters:
            k = cursor[0]
            cursor[0] += 1
            cursor[1] = sizes[1] if keep_after[k] else None
            if kept:
                state.drop_buffer(ZERO3_KEPT, kept.pop(id(node), 0))
        own = sizes[0]
        available = own + (state.buffers.get(ZERO3_KEPT, 0) if kept else 0)
        return own + (full_prefetch if available // pb <= room else _prefetch_bytes(setup, available))

    def released(node: Node) -> None:
        """After a leaf ran: its gathered weights stay if it is used again within the reuse distance."""
        if cursor[1] is not None and not node.children:
            kept[id(node)] = cursor[1]
            state.add_buffer(ZERO3_KEPT, cursor[1])
            cursor[1] = None

    def forward(node: Node, stack: dict, keep: bool, phase: str = "forward", span: tuple[int, int] | None = None) -> None:
        """The forward of `node`; phase "backward" is a checkpointing unit's recomputation.
        `span` runs only those of a root's children (expand.forward_order); the root's own
        tensors are charged with its first child."""
        inst = node.inst
        lo, hi = span or (0, len(node.children))
        if fs is not None and inst.shard_unit and phase == "forward" and inst.path not in fs.entered:
            # NB: the unit's inputs exist before its pre-forward all-gathers its weights
            if inst.checkpointed and keep:
                state.charge(inst.module, node.cost.checkpoint, kept=True)
            gap = sum(b for name, b in node.cost.unit_input if name not in state.live)
            fs.pre_forward(node, _push(stack, inst.module, gap))
            forward(node, stack, keep, phase)
            fs.post_forward(node)
            return
        if inst.checkpointed and keep and phase == "forward":
            # NB: the unit's inputs exist before it runs (the previous layer's output), so
            # they count during its first forward, not from its end.
            state.charge(inst.module, node.cost.checkpoint, kept=True)
            forward(node, stack, keep=False)
            return
        if lo > 0:
            pass  # NB: the rest of a split root: its own tensors were charged with its first part
        elif keep:
            state.charge(inst.module, node.cost.saved, kept=True)
        elif phase == "forward" and node.cost.pinned:
            # NB: what the training loop holds (the loss) is no saved tensor: offloading or a
            # checkpointing unit's first forward keeps it all the same
            state.charge(inst.module, [x for x in node.cost.saved if x[0] in node.cost.pinned], kept=True)
        if phase == "forward" and lo == 0:
            state.charge(inst.module, node.cost.held)
            held.extend(node.cost.held)
            if not keep and node.cost.cached and not act_offload:
                # NB: autocast's cast cache keeps a trainable weight's 16-bit copy until the
                # forward ends, though a checkpointing unit keeps none of its saved tensors
                state.charge(inst.module, node.cost.cached)
                held.extend(node.cost.cached)
        # NB: inside a checkpointing unit's first forward nothing is kept, but a layer's
        # would-be saved tensors still exist while it runs.
        t = _push(stack, inst.module, node.cost.transient_forward + gather(node))
        if not node.children:
            cached = {name for name, _ in node.cost.cached} if phase == "forward" and not act_offload else set()
            unkept = 0 if keep else sum(b for name, b in node.cost.saved if name not in cached)
            state.observe(phase, inst.path, _push(t, inst.module, unkept), (inst.module, node.cost.transient_forward))
            released(node)
        for c in node.children[lo:hi]:
            forward(c, t, keep, phase)

    def backward(node: Node, stack: dict, span: tuple[int, int] | None = None) -> None:
        """The backward of `node`; `span` as in `forward`: a split root's gradients appear and
        its own tensors are freed with its first child's backward, the last of its parts."""
        inst = node.inst
        lo, hi = span or (0, len(node.children))
        if lo > 0:
            t = _push(stack, inst.module, node.cost.transient_backward)
            for c in reversed(node.children[lo:hi]):
                backward(c, t)
            return
        # NB: around an FSDP unit's backward hooks its output's gradient (before) and its
        # input's (after) exist: the size of its input
        grad_io = node.cost.unit_input[0][1] if fs is not None and node.cost.unit_input else 0
        if fs is not None and inst.shard_unit:
            fs.pre_backward(node, _push(stack, inst.module, grad_io))
        if inst.checkpointed:
            # NB: the unit's backward transient (the gradient of its output, which triggers
            # the recomputation) is alive while it recomputes
            forward(node, _push(stack, inst.module, node.cost.transient_backward), keep=True, phase="backward")
        t = _push(stack, inst.module, node.cost.transient_backward + gather(node) + unpacked(node))
        for c in reversed(node.children[:hi]):
            backward(c, t)
        if node.cost.gradients:
            # NB: a gradient computed in forward (a fused loss) was live as a saved tensor;
            # it becomes the .grad here rather than being allocated beside it
            state.free(inst.path, [(name, 0) for name in node.cost.handover])
            if zero12_hooked:
                zero12_join(node, t)
            elif not grads_resident:
                state.add_grad(inst.module, inst.path, blocks[id(node)][1])
            if zero3 and not node.children:
                for size in ipg.add(node.cost):
                    # the bucket is reduced while this layer's gradient waits to join it
                    reducing(size, inst.path, t)
        if not node.children:
            state.observe("backward", inst.path, t, (inst.module, node.cost.transient_backward))
            released(node)
        state.free(inst.path, [x for x in node.cost.saved + node.cost.checkpoint if x[0] not in node.cost.pinned])
        if fs is not None and inst.shard_unit:
            fs.post_backward(fs.plan.units[inst.path], _push(stack, inst.module, grad_io))

    def reducing(size: int, path: str, stack: Mapping[str, int]) -> None:
        """The moment a DeepSpeed bucket is reduced: its temporaries (`size`) alive, then gone."""
        state.add_buffer(DEEPSPEED_RS, size)
        state.observe("backward", path, stack)
        state.drop_buffer(DEEPSPEED_RS, size)

    def zero12_reduce(path: str, stack: Mapping[str, int], waiting: int) -> None:
        """Reduce ZeRO-1/2's bucket; the first reduction makes the gradient partition."""
        size, large = bucket12.flush(waiting)
        reducing(size, path, stack)
        if setup.zero == 2:
            # NB: ZeRO-1's reduce_ipg_grads clears no gradient: a too-large one outside this
            # rank's partition stays whole until the epilogue's _clear_param_grad_only
            # (zero_grad(set_to_none=True) in the older engines); kept for every such gradient
            # (an upper bound: those inside the partition are copied and freed)
            state.drop_buffer(ZERO12_WAIT, large)
        if size and ZERO12_GRADS not in state.buffers:
            state.add_buffer(ZERO12_GRADS, zero12_part)

    def zero12_join(node: Node, stack: Mapping[str, int]) -> None:
        """A layer's gradients join ZeRO-1/2's bucket in backward order, each after the
        reduction it causes (as _IpgBucket.add)."""
        for numel in reversed(_grad_elements(node.cost, setup.bytes["param"], setup.bytes["grad"])):
            if bucket12.overflows(numel):
                zero12_reduce(node.inst.path, stack, numel)
            if bucket12.join(numel):
                state.add_buffer(ZERO12_WAIT, round_up(numel * setup.bytes["grad"], ALLOCATOR_GRANULE))

    # NB: not `offload`, DeepSpeed's optimizer-offload buffers above
    act_offload = setup.activation_offloading

    def unpacked(node: Node) -> int:
        """Offloaded: the device copies a leaf's backward unpacks from host memory, its
        saved tensors less those handed over as gradients (each node unpacks its own copy,
        so tensors shared by name count once per leaf)."""
        if not act_offload or node.children:
            return 0
        return sum(round_up(b, ALLOCATOR_GRANULE) for name, b in node.cost.saved if name not in node.cost.handover + node.cost.pinned)

    if setup.pp > 1 and trainable and not act_offload:
        # 1F1B (Narayanan et al. 2021, section 2.2): the first stage runs pp forwards before
        # its first backward, so pp - 1 other micro-batches' saved activations are alive
        # through this one's forward and backward
        state.add_buffer(PIPELINE, (setup.pp - 1) * _saved_per_microbatch(nodes))
    held: list = []  # tensors the model's outputs keep until the forward ends
    ipg = _IpgBucket(setup) if zero3 else None
    walk_start = len(state.events)
    if fs is not None:
        fs.root_pre_forward()
    order = forward_order(tuple(n.inst for n in nodes))
    for i, lo, hi in order:
        # NB: offloaded, a saved tensor lives on the device only while the code that made it
        # still holds it: as in a checkpointing unit's first forward, nothing is kept
        forward(nodes[i], {}, keep=not act_offload, span=(lo, hi))
    if fs is not None:
        fs.root_post_forward()
    state.release(held)
    end_of_forward = dict(state.live_by_module)
    if trainable:
        # DeepSpeed allocates its gradient reduce buckets when backward starts (engine.backward
        # -> optimizer.backward) and keeps them through the step.
        state.add_buffer(DEEPSPEED, _bucket_bytes(setup))
        if fs is not None:
            fs.root_pre_backward()
        norm = offload[1]
        for i, lo, hi in reversed(order):
            backward(nodes[i], {modules[-1]: norm} if norm else {}, span=(lo, hi))
        if zero3:
            # independent_gradient_partition_epilogue reduces what is left in the bucket
            reducing(ipg.flush(0), "deepspeed.reduce_scatter", {})
        if zero12 and not zero12_hooked:
            # ZeRO-1 without overlap_comm: reduce_gradients moves the whole gradients through the
            # bucket after backward, in group order; the partition appears at the first
            # reduction. NB: charged with every whole gradient and the largest reduction
            # (an upper bound: each whole gradient is freed as it joins the bucket)
            worst = 0
            for t in stepped_tensors(nodes, setup):
                if bucket12.overflows(t.elements):
                    worst = max(worst, bucket12.flush(0)[0])
                bucket12.join(t.elements)
            worst = max(worst, bucket12.flush(0)[0])
            reducing(worst + zero12_part, "deepspeed.reduce_gradients", {})
            state.drop_grads()
            state.add_buffer(ZERO12_GRADS, zero12_part)
        elif zero12:
            # independent_gradient_partition_epilogue -> reduce_ipg_grads reduces the rest
            zero12_reduce("deepspeed.reduce_ipg_grads", {}, 0)
            if ZERO12_GRADS not in state.buffers:
                state.add_buffer(ZERO12_GRADS, zero12_part)
            state.drop_buffer(ZERO12_WAIT, state.buffers.get(ZERO12_WAIT, 0))  # _clear_param_grad_only
        if setup.deepspeed is not None and setup.zero in (1, 2) and plan is None:
            # the epilogue's _release_ipg_buffers frees the ipg buffers before the step
            state.drop_buffer(DEEPSPEED, _bucket_bytes(setup))
        # the loop drops the loss (and backward() its seed gradient) once backward returns
        state.free_pinned([name for r in nodes for n in r.walk() for name in n.cost.pinned])
        if fs is not None:
            fs.root_post_backward()
    largest = _largest_trainable(nodes, setup)
    if plan is not None:
        total = plan.step_temporaries(nodes, setup)
        step_transient = {modules[-1]: total} if total else {}
    elif _offloaded(setup):
        # NB: DeepSpeedCPUAdam steps in host memory; ZeRO-3 keeps its per-parameter norms
        # on the GPU until the step ends
        step_transient = {modules[-1]: offload[2]} if offload[2] else {}
    else:
        stepped = stepped_tensors(nodes, setup)
        step_transient = _step_transient(setup, stepped, largest, o_div, modules)
        if zero12:
            phases = zero12_step_temporaries(setup, stepped)
            if phases["after_partition"] - zero12_part > phases["with_partition"]:
                # the last group steps once grads_in_partition is freed
                state.drop_buffer(ZERO12_GRADS, zero12_part)
                step_transient = {modules[-1]: phases["after_partition"]}
            else:
                step_transient = {modules[-1]: phases["with_partition"]}
    step_start = len(state.events)
    state.observe("optimizer", "optimizer.step", step_transient)
    if plan is None and o_div == 1 and not _offloaded(setup) and trainable and not zero3 and not zero12:
        # the replay sees the step tensor by tensor, as torch's optimizer allocates it
        del state.events[step_start:]
        state.events.extend(_step_events(setup, stepped, largest))
    step = state._point("optimizer", "optimizer.step", state.level + sum(step_transient.values()), step_transient)
    first_step_point = step
    # NB: sharded (ZeRO, FSDP2), offloaded, ZeRO-3 (stepped sub-group by sub-group) or ZeRO-1/2
    # (stepped group by group on flat partitions, even at dp 1), step 1's optimizer point is the
    # steady one: an upper bound (its states are made during the step as well)
    if plan is None and o_div == 1 and not _offloaded(setup) and trainable and not zero3 and not zero12:
        first_step_point = _first_step_optimizer(setup, stepped, largest, step, step_transient, modules)

    per_gpu_totals = {
        m: {**per_gpu[m], "gradients": sum(blocks[id(n)][1] for r in nodes if r.inst.module == m for n in r.walk())
            if plan is None else sum(u.rs_out for u in [*plan.unit_list(), plan.root] if u.module == m)}
        for m in modules
    }
    # The seed paper's Eq. 1: the four factors summed, per GPU, activations as kept for backward.
    seed_sum = sum(sum(c.values()) for c in per_gpu_totals.values()) + sum(end_of_forward.values())
    resident_blocks = [b for r in nodes for n in r.walk() for b in _resident_blocks(n, setup, blocks, plan, p_div)]
    states = [b for r in nodes for n in r.walk() for b in _state_blocks(n, setup, blocks, plan, o_div)]
    states += [round_up(b, ALLOCATOR_GRANULE) for b in once]
    reserved, oom = _replay(setup, state, resident_blocks, states, walk_start, step_start)
    return Estimate(
        peak=state.best,
        reserved=reserved,
        oom=oom,
        # Step 1 has no optimizer states before step() creates them; its step() makes
        # them as it goes (see _first_step_optimizer).
        first_step=max(state.first_point(), first_step_point, key=lambda p: p.total),
        timeline=tuple(state.timeline),
        resident=per_gpu_totals,
        activations_end_of_forward=end_of_forward,
        seed_sum=seed_sum,
        not_modelled=_not_modelled(setup) + _paged_note(nodes, setup),
        trainable_params=trainable,
    )


def _saved_per_microbatch(nodes) -> int:
    """Bytes one micro-batch's forward leaves saved for its backward (what a checkpointing
    unit keeps, else every saved tensor, each name once), allocator-rounded."""
    seen: dict[str, int] = {}

    def walk(node: Node) -> None:
        kept = node.cost.checkpoint if node.inst.checkpointed else node.cost.saved
        for name, size in kept:
            seen.setdefault(name, round_up(size, ALLOCATOR_GRANULE))
        if not node.inst.checkpointed:
            for c in node.children:
                walk(c)

    for root in nodes:
        walk(root)
    return sum(seen.values())


def _resident_blocks(node: Node, setup: Setup, blocks: dict, plan, p_div: int) -> list[int]:
    """A layer's weights and buffers as allocations: each tensor its own where whole, one
    flat partition where ZeRO-3 or FSDP2 shards them."""
    c = node.cost
    out = [round_up(b, ALLOCATOR_GRANULE) for b in c.buffer_tensors]
    if plan is not None:
        return out + [plan.resident(node, setup)[0]]
    if p_div == 1 and not (setup.zero == 3 and _offloaded(setup)):
        return out + [round_up(t, ALLOCATOR_GRANULE) for t in c.param_tensors]
    return out + [blocks[id(node)][0]]


def _state_blocks(node: Node, setup: Setup, blocks: dict, plan, o_div: int) -> list[int]:
    """A layer's optimizer states (fp32 master copies included) as allocations: each state
    of each tensor its own, or the layer's share of a flat partition when sharded."""
    if plan is not None:
        return [plan.resident(node, setup)[1]]
    c = node.cost
    if not c.optimizer_states or o_div > 1 or _offloaded(setup):
        return [blocks[id(node)][2]]
    mine, shapes = trained(node.inst, c.param_tensors, c.param_shapes, c.param_names)
    out = []
    for t, shape in zip(mine, shapes):
        e = t // setup.bytes["param"]
        if setup.master_bytes:
            out.append(round_up(e * setup.master_bytes, ALLOCATOR_GRANULE))
        out += [round_up(x.nbytes, ALLOCATOR_GRANULE) for x in _states(setup, e, shape) if not x.paged]
    return out


def _replay(setup: Setup, state: _State, resident: list[int], states: list[int], walk_start: int,
            step_start: int) -> tuple[int, OutOfMemory | None]:
    """The caching allocator's reserved bytes over two training steps, and the allocation
    that fails on `setup.gpu` if one does.

    The replay runs what a job allocates in its order: the weights and buffers, the
    cuBLAS workspaces, the allocations made before the walk (ZeRO-3's gradient partition,
    DeepSpeed's staging buffers), then step 1 (the walk's forward and backward, the
    optimizer states made at its step(), the step's temporaries) and step 2 (the same with
    the states in place); whatever a step made and still holds goes at its end
    (zero_grad(set_to_none=True)). Step 1's pattern of frees leaves cached blocks that step
    2 is served from, which is why two steps are replayed.
    NB: a formula's transient is one allocation (the running layer's, beside the rest of its
    module's stack), and so are a layer's gradients: finer in the real step, so fragmentation
    is modelled at that grain.
    """
    capacity = None
    if setup.gpu is not None:
        capacity = setup.gpu.memory - device_overhead(setup)
    walk, step = state.events[walk_start:step_start], state.events[step_start:]

    def run(allocator: Allocator) -> int:
        live, probe, malloc, free = allocator.live, allocator.probe, allocator.malloc, allocator.free

        def play(events, made: list) -> None:
            """NB: an allocation still live from the step before (a buffer DeepSpeed keeps)
            is kept, not made again; `made` collects what this step allocated."""
            for key, size in events:
                if key is PROBE:
                    probe(size)
                elif size is None:
                    if key in live:
                        free(key)
                elif key not in live:
                    malloc(key, size)
                    made.append(key)

        for i, size in enumerate(resident):
            if size:
                malloc(("weight", i), size)
        for thread in range(setup.target.gemm_threads):
            malloc(("workspace", thread), setup.target.workspace)
        play(state.events[:walk_start], [])
        for number in (1, 2):
            made: list = []
            play(walk, made)
            if number == 1:
                for i, size in enumerate(states):
                    if size:
                        malloc(("state", i), size)
            play(step, made)
            for key in made:
                if key in live:
                    free(key)
        return allocator.peak_reserved

    try:
        return run(Allocator(setup.alloc_conf, capacity)), None
    except OutOfMemoryError as error:
        # NB: the figure is then what the step would need: the same replay on a device
        # without a limit, and at least what the failed request would have made it
        oom = error.oom
        return max(run(Allocator(setup.alloc_conf)), oom.reserved + allocation_size(round_size(oom.requested, setup.alloc_conf))), oom


def device_overhead(setup: Setup) -> int:
    """What the device holds beside the allocator's segments: the CUDA context, and NCCL's
    buffers when data-parallel (specs/gpus.yaml)."""
    consts = gpu_catalog()[1]
    return consts.cuda_context + (consts.nccl_per_communicator if setup.dp > 1 else 0)


def _push(stack: Mapping[str, int], module: str, extra: int) -> Mapping[str, int]:
    if not extra:
        return stack  # NB: never mutated, so sharing it is safe and saves a copy per layer
    out = dict(stack)
    out[module] = out.get(module, 0) + extra
    return out


def _offloaded(setup: Setup) -> bool:
    """DeepSpeed's optimizer offload (zero_optimization.offload_optimizer, cpu or nvme)."""
    return setup.deepspeed is not None and setup.deepspeed.offload_optimizer != "none"


def _params_offloaded(setup: Setup) -> bool:
    """DeepSpeed ZeRO-3's parameter offload (zero_optimization.offload_param, cpu or nvme)."""
    return setup.deepspeed is not None and setup.deepspeed.offload_param != "none"


# deepspeed/runtime/zero/stage3.py, DeepSpeedZeroOptimizer_Stage3._constant_buffered_norm2:
# the norm is taken over chunks of at most 250_000_000 elements (buffer_size)
NORM_CHUNK = 250_000_000


def _offload_buffers(setup: Setup, largest: int, tensors: int = 0) -> tuple[int, int, int]:
    """(resident, backward transient, step transient) GPU bytes of DeepSpeed's optimizer offload.

    ZeRO-1/2, deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer:
    - __init__ with cpu_offload: `temp_grad_buffer_for_gpu_offload`, torch.zeros of the
      largest parameter's numel in the 16-bit dtype on the GPU, kept for the whole run (the
      fp32 partition `single_partition_of_fp32_groups` and its .grad are on the CPU);
    - copy_grads_in_partition with cpu_offload: no GPU gradient partition
      (`grads_in_partition` is never allocated); per parameter, set_norm_for_param_grad_in_gpu
      takes `.double().norm(2)` of its slice (8 bytes per element), then
      async_inplace_copy_grad_to_fp32_buffer_from_gpu converts it `.to(fp32)` (4 bytes) for
      the copy to the host. NB: the slice is at most the whole parameter; it is charged as
      the largest parameter's, for the whole backward (an upper bound: only the moment its
      bucket is reduced holds it).
    - step() runs the optimizer on the CPU: no optimizer temporaries on the GPU.

    ZeRO-3, deepspeed/runtime/zero/stage3.py, DeepSpeedZeroOptimizer_Stage3 (cpu and nvme):
    - _setup_for_real_optimizer: `grad_partitions_flat_buffer` and the fp32 partitions
      (_create_fp32_partitions) are made on self.device, the CPU with offload_optimizer
      (pinned with pin_memory); with nvme the fp32 partitions and states are swapped through
      pinned host buffers (swap_tensor/partitioned_optimizer_swapper.py): nothing resident on
      the GPU besides what ZeRO-3 keeps without offload (the IPG bucket, the 16-bit
      partition unless offload_param);
    - __partition_grads, per parameter of a reduced bucket: `grad_buffer.to(grad_partition.device)`,
      a GPU copy of its gradient partition in the 16-bit dtype, then
      _constant_buffered_norm2 takes `.double()` of it in chunks of NORM_CHUNK elements
      (8 bytes each), keeping the float64 norm in `norm_for_param_grads`, one 0-dim tensor
      (an allocator granule) per parameter until _post_step's reset_cpu_buffers. NB: the
      copy and the chunk are charged as the largest parameter's partition
      (ceil(numel / dp)), with every parameter's norm, for the whole backward (an upper
      bound); with nvme `grad_buffer.float()` (4 bytes) is made after the double is freed,
      so the bound holds;
    - step: complete_grad_norm_calculation_for_cpu_offload's `total_norm_cuda` (one
      granule) beside the norms; the CPU Adam updates the fp32 partition in host memory and
      _reassign_or_swap_out_partitioned_parameters copies it into the 16-bit partition
      (a host-to-device copy_ with a dtype change converts on the host: torch's
      copy_kernel_cuda), no GPU temporary.
    Not measured (DeepSpeed and a GPU are not available here).
    """
    if not _offloaded(setup):
        return 0, 0, 0
    if setup.zero == 3:
        part = _div(largest, setup.dp)
        copy = round_up(part * setup.bytes["grad"], ALLOCATOR_GRANULE)
        double = round_up(min(part, NORM_CHUNK) * 8, ALLOCATOR_GRANULE)
        norms = tensors * ALLOCATOR_GRANULE
        return 0, copy + double + norms, norms + ALLOCATOR_GRANULE
    resident = round_up(largest * setup.bytes["grad"], ALLOCATOR_GRANULE)
    norm = round_up(largest * 8, ALLOCATOR_GRANULE)  # float64
    return resident, norm, 0


def _div(n: int, d: int) -> int:
    return -(-n // d)


def _trainable_elements(nodes, setup: Setup) -> int:
    """Parameters the optimizer steps: those with gradients, and those with flat states
    (their fp32 gradients are zero-filled and stepped like the others)."""
    return sum(t // setup.bytes["param"] for r in nodes for n in r.walk() if n.inst.trainable or n.inst.flat_states or n.inst.bias_only
               for t in trained(n.inst, n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names)[0])


def _trainable_tensors(nodes, setup: Setup) -> list[tuple[int, tuple[int, ...] | None]]:
    """(element count, shape) of every tensor the optimizer steps."""
    return [(t // setup.bytes["param"], shape) for r in nodes for n in r.walk() if n.inst.trainable or n.inst.flat_states or n.inst.bias_only
            for t, shape in zip(*trained(n.inst, n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names))]


@dataclass(frozen=True)
class Stepped:
    """One tensor the optimizer steps: its elements, dims (where the formula gives them), the
    module it belongs to and its parameter group."""
    elements: int
    shape: tuple[int, ...] | None
    module: str = ""
    group: int = 0


def stepped_tensors(nodes, setup: Setup) -> list[Stepped]:
    """The stepped tensors in the order the optimizer visits them: group by group, each in
    named_parameters() order (torch/optim/optimizer.py: `for group in self.param_groups`;
    Trainer.create_optimizer fills each group in named_parameters() order).

    named_parameters() follows registration (each module's __init__), taken here as the
    layers' forward order; a tied table (an embedding with shared_weight, whose weight the
    lm_head counts) is visited at the embedding's place, where it is registered first.
    NB: a decoder layer registers its norms after attention and MLP (Qwen2DecoderLayer.__init__)
    and runs them before: in forward order a norm's tiny states count as made earlier, an
    over-estimate of the lazily made states at a per-parameter loop's high-water mark.
    """
    opt = setup.optimizer
    out: list[Stepped] = []
    tied: list[tuple[int, tuple[int, int]]] = []  # (position, table shape) of each tied embedding
    for r in nodes:
        for n in r.walk():
            if n.inst.scope.get("shared_weight") and n.inst.trainable:
                tied.append((len(out), (n.inst.scope["vocab"], n.inst.scope["dim"])))
            if not (n.inst.trainable or n.inst.flat_states or n.inst.bias_only):
                continue
            for t, shape, name in zip(n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names or ("weight",) * len(n.cost.param_tensors)):
                if n.inst.bias_only and name != "bias":
                    continue  # NB: peft's bias option: the weight stays frozen
                group = opt.group_of(f"{n.inst.path}.{name}", n.inst.formula.module_class)
                out.append(Stepped(t // setup.bytes["param"], shape, n.inst.module, group))
    for at, shape in reversed(tied):
        later = next((i for i in range(at, len(out)) if out[i].shape == shape), None)
        if later is not None:
            out.insert(at, out.pop(later))
    return sorted(out, key=lambda t: t.group)  # NB: stable: each group keeps its order


def _largest_trainable_tensor(nodes, setup: Setup) -> int:
    """Elements of the largest parameter tensor that requires grad (DeepSpeed's largest_param_numel)."""
    return max((t // setup.bytes["param"] for r in nodes for n in r.walk() if n.inst.trainable or n.inst.flat_states or n.inst.bias_only
                for t in trained(n.inst, n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names)[0]), default=0)


def _largest_trainable(nodes, setup: Setup) -> int:
    return max((sum(trained(n.inst, n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names)[0]) // setup.bytes["param"] for r in nodes for n in r.walk()
                if (n.inst.trainable or (n.inst.bias_only and n.inst.grad_flows)) and not n.children), default=0)


def step_temporaries(setup: Setup, tensors: list[Stepped], largest: int, o_div: int = 1) -> dict[str, int]:
    """Bytes alive only during optimizer.step(), per GPU, for the stepped tensors
    (unsharded: each its own allocation; sharded: one flat partition per parameter group).

    torch's optimizers step one parameter group after the other (torch/optim/adam.py and
    sgd.py, step: `for group in self.param_groups`, then one foreach or for-loop call on
    that group's tensors, grouped by device and dtype, Optimizer._group_tensors_by_device_and_dtype),
    so a foreach temporary is the largest group's, not the whole model's:

    - master_grads: mixed precision converts the 16-bit gradients to fp32 for the master
      weights before step() (DeepSpeed converts the whole flat partition at once; DOMAIN.md);
    - foreach Adam/AdamW: `torch._foreach_sqrt(exp_avg_sqs)` returns a new tensor per state, a
      full copy of the group's second moments (torch/optim/adam.py, _multi_tensor_adam). Adam's
      coupled weight decay first makes `device_grads = torch._foreach_add(grads, params)`, a
      copy of the group's gradients in the same dtype, deleted (`del device_grads`) before the
      sqrt: the two never coexist, so the peak is the sqrt's either way;
    - for-loop Adam/AdamW: `exp_avg_sq.sqrt()` and its quotient by the bias correction, one
      parameter at a time: two copies of the largest parameter's state; Adam's coupled
      weight decay adds `grad = grad.add(param, alpha=weight_decay)`, a third, alive
      through the update (_single_tensor_adam);
    - SGD with weight decay: foreach `torch._foreach_add(device_grads, device_params)`, a
      copy of every gradient of a group with weight decay, alive through the group's step;
      for-loop `grad.add(param)`, one parameter's (torch/optim/sgd.py);
    - Adafactor (transformers): parameter by parameter; see `_adafactor_temporaries`;
    - fused AdamW, SGD without weight decay and bitsandbytes (fused CUDA kernels, in place)
      allocate none.
    """

    out = {"master_grads": _allocated(setup.master_bytes, tensors, o_div) if setup.master_bytes else 0}
    temporaries = max((t for _, t in group_temporaries(setup, tensors, largest, o_div)), default=0)
    if temporaries:
        out["optimizer_temporaries"] = temporaries
    return out


def _allocated(nbytes: int, tensors: list[Stepped], o_div: int) -> int:
    """`nbytes` per element of `tensors`: each its own allocation, or one flat partition
    of the ranks' share (ZeRO: one per parameter group, stage_1_and_2.py bit16_groups_flat)."""
    if o_div > 1:
        return _div(sum(t.elements for t in tensors) * nbytes, o_div)
    return sum(round_up(t.elements * nbytes, ALLOCATOR_GRANULE) for t in tensors)


def param_groups(tensors: list[Stepped]) -> list[tuple[int, list[Stepped]]]:
    """(group, its tensors) for every group with a tensor, in the optimizer's order."""
    groups: dict[int, list[Stepped]] = {}
    for t in tensors:
        groups.setdefault(t.group, []).append(t)
    return sorted(groups.items())


def group_temporaries(setup: Setup, tensors: list[Stepped], largest: int, o_div: int = 1) -> list[tuple[int, int]]:
    """(group, the most its step() call holds at once beside the states) for every group,
    in order; see step_temporaries. Adafactor's is the group's largest tensor's."""
    opt = setup.optimizer
    one = round_up(setup.state_bytes * largest, ALLOCATOR_GRANULE)
    out = []
    for g, members in param_groups(tensors):
        decay = opt.group_decay(g)
        temp = 0
        if opt.type in ("adamw", "adam") and not opt.bnb:
            if opt.impl == "foreach":
                temp = _allocated(setup.state_bytes, members, o_div)
            elif opt.impl == "forloop":
                # NB: the largest layer's parameters (weight and bias together) stand for the
                # largest tensor, and its group's decay for every group's: an upper bound
                coupled = opt.type == "adam" and opt.weight_decay > 0
                temp = (3 if coupled else 2) * one
        elif opt.type == "sgd" and decay > 0:
            temp = _allocated(setup.state_bytes, members, o_div) if opt.impl == "foreach" else one
        elif opt.type == "adafactor":
            temp = max((_adafactor_temporaries(setup, t.elements, t.shape) for t in members), default=0)
        out.append((g, temp))
    return out


def _step_events(setup: Setup, tensors: list[Stepped], largest: int) -> list:
    """An unsharded step()'s allocations in order, for the allocator's replay: the fp32
    gradients of the master weights (each tensor's, made before the step, alive through it),
    then group by group the foreach temporaries, one per tensor (`_foreach_sqrt`'s results,
    `_foreach_add`'s gradient copies: made together, freed after the group's update), or a
    for-loop optimizer's temporaries of its largest tensor (see step_temporaries)."""
    opt = setup.optimizer
    events: list = []
    masters = []
    if setup.master_bytes:
        for i, t in enumerate(tensors):
            masters.append(("master-grad", i))
            events.append((masters[-1], round_up(t.elements * setup.master_bytes, ALLOCATOR_GRANULE)))
    temporaries = dict(group_temporaries(setup, tensors, largest))
    for g, members in param_groups(tensors):
        foreach = opt.impl == "foreach" and ((opt.type in ("adamw", "adam") and not opt.bnb) or (opt.type == "sgd" and opt.group_decay(g) > 0))
        sizes = [round_up(t.elements * setup.state_bytes, ALLOCATOR_GRANULE) for t in members] if foreach else [temporaries[g]]
        keys = [(("step", g, i), size) for i, size in enumerate(sizes) if size]
        events += keys
        events += [(key, None) for key, _ in keys]
    events += [(key, None) for key in masters]
    return events


def _adafactor_temporaries(setup: Setup, elements: int, shape: tuple[int, ...] | None) -> int:
    """The most transformers' Adafactor.step holds at once for one parameter (fp32 throughout):

    `grad.float()` and `p.float()` when they are 16-bit (no master copy); `update = grad**2 + eps`
    (grad**2 freed once the sum exists); factored: `_approx_sq_grad` builds r_factor (the row
    vector's size) and c_factor (the column vector's) and their product, a new update, while
    the old one is alive; unfactored: `exp_avg_sq.rsqrt()` next to the old update. Later
    `p_data_fp32.add_(-update)` holds two parameter-sized tensors again, never more.
    """
    n4 = round_up(optimizers.FP32 * elements, ALLOCATOR_GRANULE)
    sixteen = not setup.master_bytes and setup.bytes["param"] < optimizers.FP32
    upcasts = 2 * n4 if sixteen else 0  # grad.float(), p.float()
    if shape is not None and optimizers.adafactor_factored(shape):
        rows, cols = optimizers.adafactor_vectors(shape)
        vectors = round_up(optimizers.FP32 * rows, ALLOCATOR_GRANULE) + round_up(optimizers.FP32 * cols, ALLOCATOR_GRANULE)
        return upcasts + 2 * n4 + vectors
    return upcasts + 2 * n4


def _created_states(setup: Setup, t: Stepped) -> int:
    """Allocated bytes of the states step() makes for one tensor (not the fp32 master
    copy, which exists before step(); not bitsandbytes' paged states, outside the allocator)."""
    return sum(round_up(x.nbytes, ALLOCATOR_GRANULE) for x in _states(setup, t.elements, t.shape) if not x.paged)


def first_step_high_water(setup: Setup, tensors: list[Stepped], largest: int) -> tuple[int, dict[str, int], int]:
    """The most step 1's optimizer.step() holds beyond the master gradients, unsharded:
    (states made so far + the temporaries then, those states per module, the temporaries).

    Step 1 makes the states inside step(), so its high-water mark is not the steady
    step's (every state + the largest temporaries):
    - torch's Adam, AdamW and SGD step group by group: `_init_group` makes the group's states
      (Adam: exp_avg and exp_avg_sq of every tensor, torch/optim/adam.py, Adam._init_group;
      SGD: the momentum buffers, cloned one by one inside the group's call, sgd.py
      _multi_tensor_sgd, all alive by its end beside the weight-decay copy), then the
      group's call runs with its temporaries: the mark is the largest of (states of this
      and the earlier groups + this group's temporaries);
    - transformers' Adafactor (optimization.py, Adafactor.step) and bitsandbytes
      (Optimizer8bit.step -> init_state) make a tensor's states when the per-parameter loop
      reaches it: the mark is the largest of (states of the tensors visited so far, this
      one's included, + this tensor's temporaries), in the loop's order (stepped_tensors).
    NB: bitsandbytes' quantile maps (optimizers.once) are not counted here; with no
    temporaries its mark is at the last tensor, every state made, as in the steady step.
    """
    best = (-1, {}, 0)
    made: dict[str, int] = {}
    total = 0
    per_tensor = setup.optimizer.type == "adafactor" or setup.optimizer.bnb
    for g, temp in group_temporaries(setup, tensors, largest):
        members = [t for t in tensors if t.group == g]
        for t in members:
            nbytes = _created_states(setup, t)
            made[t.module] = made.get(t.module, 0) + nbytes
            total += nbytes
            if per_tensor:
                now = _adafactor_temporaries(setup, t.elements, t.shape) if setup.optimizer.type == "adafactor" else 0
                if total + now > best[0]:
                    best = (total + now, dict(made), now)
        if not per_tensor and total + temp > best[0]:
            best = (total + temp, dict(made), temp)
    return best if best[0] >= 0 else (0, {}, 0)


def _first_step_optimizer(setup: Setup, tensors: list[Stepped], largest: int, step: Point,
                          step_transient: Mapping[str, int], modules) -> Point:
    """Step 1's optimizer.step() at its high-water mark: the steady step's point with only
    the states made so far and the temporaries of that moment (first_step_high_water)."""
    high, made, temp = first_step_high_water(setup, tensors, largest)
    all_made = {}
    for t in tensors:
        all_made[t.module] = all_made.get(t.module, 0) + _created_states(setup, t)
    steady_temp = sum(step_transient.values())
    master = step_temporaries(setup, tensors, largest).get("master_grads", 0)
    total = step.total - steady_temp - sum(all_made.values()) + master + high
    breakdown = {m: dict(c) for m, c in step.breakdown.items()}
    for m, nbytes in all_made.items():
        breakdown[m]["optimizer_states"] -= nbytes - made.get(m, 0)
    for m in modules:
        breakdown[m]["transient"] = 0
    breakdown[modules[-1]]["transient"] = master + temp
    return Point("optimizer", "optimizer.step", total, breakdown)


def zero3_sub_groups(setup: Setup, tensors: list[Stepped]) -> list[int]:
    """Elements of each ZeRO-3 optimizer sub-group of this rank's partition
    (deepspeed/runtime/zero/stage3.py, _create_fp16_sub_groups, called per optimizer parameter
    group: its parameters in order, each adding its partition_numel = ceil(numel / dp); a
    sub-group closes once it reaches sub_group_size, and a group at most that big is one)."""
    limit = setup.deepspeed.sub_group_size
    out = []
    for _, members in param_groups(tensors):
        parts = [_div(t.elements, setup.dp) for t in members]
        if limit >= sum(parts):
            out.append(sum(parts))
            continue
        run = 0
        for n in parts:
            run += n
            if run >= limit:
                out.append(run)
                run = 0
        if run:
            out.append(run)
    return out


def zero3_step_temporaries(setup: Setup, tensors: list[Stepped]) -> dict[str, int]:
    """What ZeRO-3's step() allocates beside its resident partitions, per GPU, at its high
    water mark (deepspeed/runtime/zero/stage3.py, DeepSpeedZeroOptimizer_Stage3.step):
    - _get_norm_groups -> get_grad_norm_direct: `g.double().norm(2)` one gradient partition at
      a time, 8 bytes per element of the largest;
    - per sub-group, _prepare_fp32_grad_for_sub_group: `self.flatten(averaged_gradients)` (a
      16-bit torch.cat of the sub-group's gradient partitions) `.to(fp32)`: both alive until
      the flat 16-bit copy is dropped;
    - then the optimizer steps the sub-group's fp32 partition with that fp32 gradient alive
      (torch's Adam on one flat tensor: see step_temporaries), and _release_sub_group frees
      the gradient before the next sub-group.
    The largest sub-group decides; with the default sub_group_size (1e9) a partition under a
    billion elements is one sub-group."""
    groups = zero3_sub_groups(setup, tensors)
    if not groups:
        return {}
    sg = max(groups)
    fp32 = round_up(sg * setup.master_bytes, ALLOCATOR_GRANULE) if setup.master_bytes else 0
    convert = round_up(sg * setup.bytes["grad"], ALLOCATOR_GRANULE) + fp32
    stepping = step_temporaries(setup, [Stepped(sg, None)], sg)
    norm = round_up(max(_div(t.elements, setup.dp) for t in tensors) * 8, ALLOCATOR_GRANULE)
    phases = {"grad_norm": norm, "flatten_to_fp32": convert, "step": sum(stepping.values())}
    return {"zero3_step": max(phases.values())}


def _step_transient(setup: Setup, tensors: list[Stepped], largest: int, o_div: int, modules) -> dict[str, int]:
    if setup.deepspeed is not None and setup.zero == 3 and setup.fsdp is None:
        total = sum(zero3_step_temporaries(setup, tensors).values())
        return {modules[-1]: total} if total else {}
    total = sum(step_temporaries(setup, tensors, largest, o_div).values())
    # NB: the temporaries belong to the optimizer, not a module; shown under the last
    # module so that the breakdown still sums to the total.
    return {modules[-1]: total} if total else {}


def _bucket_bytes(setup: Setup) -> int:
    """DeepSpeed's gradient reduce buffers, per GPU.

    ZeRO-1/2 with contiguous_gradients: `reduce_bucket_size` elements in the gradient dtype,
    two with overlap_comm (deepspeed/runtime/zero/stage_1_and_2.py, backward(): ipg_buffer
    buf_0, and buf_1 "to avoid data access conflict when overlap_comm is enabled"). ZeRO-3:
    one flat bucket of `reduce_bucket_size` elements (stage3.py, the ipg bucket buffer).
    """
    ds = setup.deepspeed
    if ds is None:
        return 0
    one = round_up(ds.reduce_bucket * setup.bytes["grad"], ALLOCATOR_GRANULE)
    if setup.zero == 3:
        return one
    if not ds.contiguous_gradients:
        return 0
    return (2 if ds.overlap_comm else 1) * one


def _zero12_active(setup: Setup) -> bool:
    """ZeRO-1/2 with contiguous_gradients and the optimizer on the GPU: the case whose gradient
    partition, buckets and step stage_1_and_2.py is modelled from here."""
    ds = setup.deepspeed
    return (ds is not None and setup.zero in (1, 2) and setup.fsdp is None and not _offloaded(setup)
            and ds.contiguous_gradients)


def zero12_partition_sizes(setup: Setup, tensors: list[Stepped]) -> list[int]:
    """Elements of this rank's fp32 partition per parameter group: the group's elements padded
    to a multiple of ZERO12_ALIGNMENT x dp, divided by dp (stage_1_and_2.py, __init__:
    flatten_dense_tensors_aligned, then partition_size = len(bit16_groups_flat[i]) / dp)."""
    align = ZERO12_ALIGNMENT * setup.dp
    return [round_up(sum(t.elements for t in members), align) // setup.dp for _, members in param_groups(tensors)]


def zero12_grads_in_partition(setup: Setup, tensors: list[Stepped]) -> int:
    """Elements of `grads_in_partition` on the rank that holds the most.

    stage_1_and_2.py (02aa38c3), DeepSpeedZeroOptimizer.copy_grads_in_partition: the first
    reduced gradient of this rank's partition makes it, `torch.empty(total_size)` in the 16-bit
    dtype, where total_size sums `numel()` of every parameter in `params_in_partition`, over all
    groups: the whole parameters that overlap the rank's range (get_partition_info), not only
    their slices. It stays alive through the step: the epilogue drops the name but
    `averaged_gradients` (get_flat_partition, return_tensor_list) keeps views of it until
    step() sets each group's to None."""
    best = [0] * setup.dp
    for (_, members), size in zip(param_groups(tensors), zero12_partition_sizes(setup, tensors)):
        start = 0
        for t in members:
            if t.elements:
                for r in range(start // size, min(setup.dp - 1, (start + t.elements - 1) // size) + 1):
                    best[r] += t.elements
            start += t.elements
    return max(best, default=0)


def _grad_elements(cost, param_bytes: int, grad_bytes: int) -> list[int]:
    """Elements of each gradient a layer hands DeepSpeed's bucket, in registration order.
    NB: a layer with frozen parameters beside trainable ones (LoRA's base weight): its
    gradients taken as one tensor."""
    per = [t // param_bytes for t in cost.param_tensors]
    if sum(per) * grad_bytes != cost.gradients:
        per = [cost.gradients // grad_bytes]
    return per


class _Bucket:
    """A DeepSpeed gradient bucket (reduce_bucket_size elements) as backward fills it."""

    def __init__(self, setup: Setup) -> None:
        self.limit = setup.deepspeed.reduce_bucket
        self.param, self.grad = setup.bytes["param"], setup.bytes["grad"]
        self.comm = setup.deepspeed.comm_bytes or self.grad
        self.members: list[int] = []
        self.elements = 0

    def overflows(self, numel: int) -> bool:
        """A gradient of `numel` elements makes the bucket reduce first (it is not empty)."""
        return bool(self.elements) and self.elements + numel > self.limit

    def join(self, numel: int) -> bool:
        """A gradient joins the bucket (after any reduction it caused); True when it is too
        large for the buffer and stays whole until the next reduction."""
        self.members.append(numel)
        self.elements += numel
        return numel > self.limit

    def take(self) -> list[int]:
        """The members to reduce; the bucket is empty again."""
        members = self.members
        self.members, self.elements = [], 0
        return members


class _Zero12Bucket(_Bucket):
    """ZeRO-1/2's IPG bucket as gradients join it, and what reducing a full one allocates.

    deepspeed/runtime/zero/stage_1_and_2.py (deepspeedai/DeepSpeed at 02aa38c3), DeepSpeedZeroOptimizer:
    - reduce_independent_p_g_buckets_and_remove_grads: when `bucket.elements + numel >
      reduce_bucket_size`, reduce_ipg_grads reduces the bucket first; then a gradient of at most
      reduce_bucket_size elements is copied into the preallocated ipg buffer (the `deepspeed`
      row) and its autograd tensor freed; a larger one (`extra_large_param_to_reduce`) stays
      whole until the next reduction reduces it where it is;
    - average_tensor (reduce_scatter, use_multi_rank_bucket_allreduce: the defaults) ->
      allreduce_and_scatter -> allreduce_and_copy_with_multiple_ranks -> allreduce_bucket:
      `self.flatten(bucket)` of the bucket's per-rank slices, a new tensor of all the bucket's
      elements in the 16-bit dtype, and with another communication_data_type its
      `.to(communication_data_type)` copy; both live until the all-reduce's results are
      copied back. NB: a bucket of one slice flattens to a view (no copy); every bucket is
      charged the copy (an upper bound).
    At a reduction the gradient that triggered it is still whole: counted with it.
    """

    def flush(self, waiting: int) -> tuple[int, int]:
        """Reduce the bucket: (bytes alive while it is reduced, beyond the buffers and the
        waiting extra-large gradient; bytes of an extra-large gradient freed by it)."""
        members = self.take()
        if not members:
            return 0, 0
        elements = sum(members)
        size = round_up(elements * self.grad, ALLOCATOR_GRANULE)  # flatten(bucket)
        if self.comm != self.grad:
            size += round_up(elements * self.comm, ALLOCATOR_GRANULE)  # .to(communication_data_type)
        large = sum(round_up(n * self.grad, ALLOCATOR_GRANULE) for n in members if n > self.limit)
        return size + round_up(waiting * self.grad, ALLOCATOR_GRANULE), large


def zero12_step_temporaries(setup: Setup, tensors: list[Stepped]) -> dict[str, int]:
    """What ZeRO-1/2's step() allocates beside the resident states, per GPU, at its high-water
    marks: {"with_partition": beside grads_in_partition, "after_partition": once it is freed}
    (deepspeed/runtime/zero/stage_1_and_2.py at 02aa38c3, DeepSpeedZeroOptimizer.step):
    - check_overflow -> has_overflow_partitioned_grads_serial -> _has_inf_or_nan, per averaged
      gradient: `x.float()`, `isnan`, `isinf`, `logical_or` and its `.float()`, all alive at
      once (4 + 1 + 1 + 1 + 4 bytes per element of the largest);
    - scaled_global_norm -> get_grad_norm_direct: `g.data.double()` one gradient at a time
      (8 bytes per element of the largest) and a 0-dim norm per gradient until they are stacked;
    - per parameter group: `self.flatten(averaged_gradients[i])` (a 16-bit copy of the group's
      partition) `.to(fp32)`, both alive until the 16-bit copy is dropped; then
      `averaged_gradients[i] = None`, and _optimizer_step(i) steps the group's fp32 partition
      with that fp32 gradient alive (torch's optimizer on one flat tensor: see
      step_temporaries), freed before the next group. grads_in_partition is one buffer for
      every group, so the last group's views are its last references: that group steps after
      it is freed ("after_partition").
    Every parameter's .grad is None by then (the epilogue's _clear_param_grad_only at 02aa38c3,
    zero_grad(set_to_none=True) in the older engines): no ipg buffer or whole gradient remains.
    NB: the largest averaged gradient is taken as the largest parameter, at most the largest
    partition (an upper bound: a slice may be smaller); every stepped tensor's norm is counted."""
    sizes = zero12_partition_sizes(setup, tensors)
    if not sizes:
        return {}
    largest = min(max(t.elements for t in tensors), max(sizes))
    g = ALLOCATOR_GRANULE
    with_partition = [
        2 * round_up(largest * 4, g) + 3 * round_up(largest, g),  # _has_inf_or_nan
        round_up(largest * 8, g) + len(tensors) * g,  # get_grad_norm_direct
    ]
    after = 0
    for i, size in enumerate(sizes):
        fp32 = round_up(size * setup.master_bytes, g) if setup.master_bytes else 0
        with_partition.append(round_up(size * setup.bytes["grad"], g) + fp32)  # flatten(...).to(fp32)
        stepping = fp32 + step_temporaries(setup, [Stepped(size, None)], size).get("optimizer_temporaries", 0)
        if i == len(sizes) - 1:
            after = stepping
        else:
            with_partition.append(stepping)
    return {"with_partition": max(with_partition), "after_partition": after}


def _prefetch_bytes(setup: Setup, available: int) -> int:
    """ZeRO-3 gathers ahead of the running layer up to
    min(stage3_max_live_parameters - available, stage3_prefetch_bucket_size) elements
    (deepspeed/runtime/zero/partitioned_param_coordinator.py, PartitionedParameterCoordinator.fetch_sub_module:
    max_params_to_prefetch; `available` is __n_available_params, taken here as the gathered
    bytes of the running layer and of the layers kept for reuse, in elements).
    NB: the prefetch loop stops only once it reaches the limit, so it can pass it by one
    parameter; not modelled."""
    ds = setup.deepspeed
    if ds is None or setup.zero != 3:
        return 0
    elements = min(ds.prefetch_bucket, max(0, ds.max_live_parameters - available // setup.bytes["param"]))
    return round_up(elements * setup.bytes["param"], ALLOCATOR_GRANULE)


class _IpgBucket(_Bucket):
    """ZeRO-3's gradient bucket as backward fills it, and the reduce-scatter of each full one.

    deepspeed/runtime/zero/stage3.py (deepspeedai/DeepSpeed at 007cca6a; the same calls in
    microsoft/DeepSpeed at 0003660d), DeepSpeedZeroOptimizer_Stage3:
    - reduce_independent_p_g_buckets_and_remove_grads: when a parameter's gradient is ready
      and `bucket.elements + param.ds_numel > reduce_bucket_size` (the bucket not empty),
      __reduce_and_partition_ipg_grads reduces the bucket first, then the gradient joins it
      (__add_grad_to_ipg_bucket copies it into the preallocated ipg buffer, counted in the
      `deepspeed` row, and frees the autograd gradient); the epilogue reduces the rest;
    - __avg_scatter_grads -> deepspeed/runtime/comm/coalesced_collectives.py,
      reduce_scatter_coalesced: unless the bucket is one tensor divisible by the ranks, it
      interleaves every tensor's per-rank chunks, padded to ceil(numel / dp) with
      torch.empty, into one `torch.cat`: a new flat tensor of sum(ceil(numel / dp) * dp)
      elements in the communication dtype; the reduce-scatter writes in place and each
      rank's output partition is a view of it (no further allocation); partition_grads
      copies the views into grad_partitions_flat_buffer. The flat tensor and the paddings
      live until the call returns.
    - the communication dtype is the gradients' unless a config sets communication_data_type
      (runtime/engine.py, communication_data_type: fp16 or bf16 follow the precision); another
      dtype makes __avg_scatter_grads convert every gradient of the bucket
      (`g.to(communication_data_type)`, all alive until it returns), flatten those, and convert
      the reduced partitions back (`g.to(self.dtype)`) while the flat tensor still backs them.
    At a bucket's reduction the gradient that triggered it is still whole (not yet copied
    into the bucket): counted with it.
    """

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.dp = setup.dp

    def add(self, cost) -> list[int]:
        """The layer's gradients join the bucket; the bytes of each reduction this causes."""
        out = []
        for numel in reversed(_grad_elements(cost, self.param, self.grad)):
            if self.overflows(numel):
                out.append(self.flush(numel))
            self.join(numel)
        return out

    def flush(self, waiting: int) -> int:
        """Reduce the bucket: reduce_scatter_coalesced's flat copy and paddings, plus the
        whole gradient `waiting` (elements) to join next."""
        members, dp = self.take(), self.dp
        if not members:
            return 0
        size = 0
        if self.comm != self.grad:
            size += sum(round_up(n * self.comm, ALLOCATOR_GRANULE) for n in members)  # g.to(communication_data_type)
            size += sum(round_up(_div(n, dp) * self.grad, ALLOCATOR_GRANULE) for n in members)  # partitions .to(dtype)
        if not (len(members) == 1 and members[0] % dp == 0):
            size += round_up(sum(_div(n, dp) * dp for n in members) * self.comm, ALLOCATOR_GRANULE)
            pads = sum(1 for n in members for r in range(dp) if min(_div(n, dp), max(0, n - r * _div(n, dp))) < _div(n, dp))
            size += pads * ALLOCATOR_GRANULE  # NB: every padding chunk is under 512 B unless dp > 128
        return size + round_up(waiting * self.grad, ALLOCATOR_GRANULE)


def _zero3_trace(nodes, setup: Setup) -> list[tuple[int, int]]:
    """(id(leaf), elements) of every ZeRO-3 fetch in the order the simulator walks them:
    the forward in `expand.forward_order`, then the backward in its reverse, a checkpointing
    unit first re-running its forward (DeepSpeed's __submodule_order, recorded over a whole
    step)."""
    out: list[tuple[int, int]] = []
    bp = setup.bytes["param"]

    def forward(node: Node, lo: int = 0, hi: int | None = None) -> None:
        if not node.children:
            if node.cost.parameters and not node.inst.idle:  # NB: a wrapped original never runs
                out.append((id(node), node.cost.parameters // bp))
            return
        for c in node.children[lo:hi]:
            forward(c)

    def backward(node: Node, lo: int = 0, hi: int | None = None) -> None:
        if node.inst.checkpointed:
            forward(node)
        if not node.children and node.cost.parameters and not node.inst.idle:
            out.append((id(node), node.cost.parameters // bp))
        for c in reversed(node.children[lo:hi]):
            backward(c)

    order = forward_order(tuple(n.inst for n in nodes))
    for i, lo, hi in order:
        forward(nodes[i], lo, hi)
    if _trainable_elements(nodes, setup):
        for i, lo, hi in reversed(order):
            backward(nodes[i], lo, hi)
    return out


def _reuse_kept(trace: list[tuple[int, int]], distance: int) -> list[bool]:
    """Whether each fetch's parameters stay gathered after it: the same layer comes back before
    `distance` elements of other fetches have passed (partitioned_param_coordinator.py,
    __params_to_release: it walks __submodule_order from the next step, stops once the
    elements traversed reach max_reuse_distance, and keeps any parameter it meets)."""
    prefix = [0]
    for _, n in trace:
        prefix.append(prefix[-1] + n)
    nxt: dict[int, int] = {}
    out = [False] * len(trace)
    for k in range(len(trace) - 1, -1, -1):
        leaf = trace[k][0]
        j = nxt.get(leaf)
        # NB: DeepSpeed checks the distance before each module: the layer at j is met when
        # the elements between k and j are under the distance
        out[k] = j is not None and prefix[j] - prefix[k + 1] < distance
        nxt[leaf] = k
    return out


def _first_step_resident_optimizer(nodes, setup: Setup, o_div: int) -> dict[str, int]:
    """Per module, the optimizer bytes that exist before the first step() (the rest appears in
    it). Torch's optimizers create their states lazily; DeepSpeed ZeRO makes its fp32 master
    partition at initialization (stage_1_and_2.py, single_partition_of_fp32_groups; stage3.py,
    _create_fp32_partitions) and, since PR #5104, the states lazily (DEEPSPEED_STATES_AT_INIT)."""
    ds = setup.deepspeed
    if ds is None or _offloaded(setup):
        return {}
    out: dict[str, int] = {}
    for root in nodes:
        walk = root.walk()
        if DEEPSPEED_STATES_AT_INIT:
            total = sum(_div(n.cost.optimizer_states, o_div) for n in walk if not n.children)
        else:
            total = sum(_div(n.cost.parameters // setup.bytes["param"] * setup.master_bytes, o_div)
                        for n in walk if not n.children and n.cost.optimizer_states)
        if total:
            out[root.inst.module] = total
    return out


def _not_modelled(setup: Setup) -> tuple[str, ...]:
    out = []
    if setup.fsdp is not None:
        if setup.dp > 1:
            out.append("FSDP2 units other than the decoder/encoder layers and the root (accelerate also wraps CLIPVisionEmbeddings; counted here in the root, which stays gathered longer: an over-estimate)")
    elif setup.dp > 1 and setup.zero == 0:
        out.append("DDP gradient buckets (a second copy of the gradients unless gradient_as_bucket_view)")
    if setup.zero in (1, 2):
        if _zero12_active(setup):
            out.append("a layer's 16-bit gradient waiting for its bucket copy, except when it triggers a reduction "
                       "or is too large for the bucket")
        else:
            out.append("DeepSpeed's flat-buffer alignment padding and the moment a parameter's 16-bit gradient waits before its bucket copy")
            if setup.deepspeed is not None and setup.deepspeed.comm_bytes not in (None, setup.bytes["grad"]):
                out.append("ZeRO-1/2's copy of each bucket in communication_data_type (stage_1_and_2.py, allreduce_bucket)")
    elif setup.zero == 3:
        out.append("DeepSpeed's flat-buffer alignment padding, and a layer's 16-bit gradient waiting for its bucket copy "
                   "except when it triggers a bucket's reduce-scatter")
    if setup.tp > 1:
        out.append("tensor-parallel communication buffers (all-gather / reduce-scatter outputs beyond the layers' own tensors)")
    if setup.pp > 1:
        out.append("pipeline send/receive buffers of the stage boundary's activations and gradients ([s, b, hidden] each)")
    if setup.zero >= 3 and setup.deepspeed is not None and (setup.dp > 1 or setup.deepspeed.offload_param != "none"):
        out.append("ZeRO-3's first step records the fetch trace and neither prefetches nor keeps layers for reuse; "
                   "the estimate walks the traced (later) steps' fetches in both")
    if setup.quantization is not None:
        # NB: peft/utils/other.py, prepare_model_for_kbit_training: every fp16/bf16 parameter
        # left unquantized is cast to fp32 (LLaVA's train.py casts some back afterwards)
        out.append("peft prepare_model_for_kbit_training's fp32 copy of the unquantized 16-bit weights (norms, embeddings, lm_head), "
                   "and bitsandbytes' outlier columns (LLM.int8() threshold 6.0)")
    return tuple(out)


def _paged_note(nodes, setup: Setup) -> tuple[str, ...]:
    paged = _paged_bytes(nodes, setup)
    if not paged:
        return ()
    return (f"bitsandbytes paged optimizer states, {paged:,} B in CUDA unified memory (cudaMallocManaged): outside "
            "max_memory_allocated and reserved, resident on the GPU until memory runs short, then paged to host memory",)


# --------------------------------------------------------------------------- FSDP2


@dataclass(frozen=True)
class _Unit:
    """One fully_shard unit's allocations on rank 0 (bytes, each rounded to the granule).

    torch/distributed/fsdp/_fully_shard (torch 2.13):
    - `inp`: with a mixed-precision policy, the shards cast to param_dtype in one flat
      buffer (_get_param_all_gather_inputs, the foreach-copy path), freed once copied in;
    - `flat`: foreach_all_gather's output, world_size x the padded shards in the compute
      dtype (_fsdp_collectives.py, foreach_all_gather; the all-gather input is a view of it);
    - `gathered`: the unsharded parameters, one all_gather_output per parameter, filled by the
      copy-out (FSDPParam.init_all_gather_outputs / alloc_storage);
    - `rs_in`: foreach_reduce's reduce-scatter input, world_size x the padded shards of the
      parameters with a gradient, in reduce_dtype;
    - `rs_out`: its output, the flat sharded gradient the parameters' .grad views
      (as_strided), in the sharded parameters' dtype; `cast` is the reduce_dtype output
      alive next to it when reduce_dtype differs (_to_dtype_if_needed).
    """

    path: str
    module: str
    nodes: tuple  # the nodes whose parameters the unit holds
    gathered: int
    flat: int
    inp: int
    rs_in: int
    rs_out: int
    cast: int


class _FsdpPlan:
    """The units of a model under FSDP2, and the sharded bytes per module on rank 0.

    Units as accelerate's FSDP2 auto wrap makes them: every layer HF lists in
    `_no_split_modules` (the formulas' checkpointing units: decoder and encoder layers),
    then the root, which holds every parameter outside them (embeddings, final norm,
    lm_head, projector). Each parameter is sharded on dim 0, padded to a multiple of dp:
    rank 0 holds ceil(dim0 / dp) rows (formulas give dim 0 as `parameter_rows` where it
    may not divide; elsewhere ceil(numel / dp) elements).
    """

    def __init__(self, nodes: tuple[Node, ...], setup: Setup):
        f = setup.fsdp
        self.n = setup.dp
        self.reshard = f.reshard_after_forward
        unit_nodes: dict[str, list] = {}
        order: list[tuple[str, str]] = []
        root_nodes: list = []
        self.unit_of: dict[int, str] = {}
        for root in nodes:
            for top in root.walk():
                if top.inst.shard_unit and id(top) not in self.unit_of:
                    unit_nodes[top.inst.path] = list(top.walk())
                    order.append((top.inst.path, top.inst.module))
                    for n in top.walk():
                        self.unit_of[id(n)] = top.inst.path
        for root in nodes:
            for n in root.walk():
                if id(n) not in self.unit_of:
                    root_nodes.append(n)
        compute = setup.bytes["param"]
        sharded = f.sharded_bytes
        self.sharded = sharded

        def unit(path: str, module: str, members: list) -> _Unit:
            shards = [(e, n.inst.trainable) for n in members for e in self.tensors(n, setup)]
            grads = [e for e, trainable in shards if trainable]
            rs_in = round_up(sum(grads) * self.n * f.reduce_bytes, ALLOCATOR_GRANULE) if grads else 0
            return _Unit(
                path, module, tuple(members),
                gathered=sum(round_up(e * self.n * compute, ALLOCATOR_GRANULE) for e, _ in shards),
                flat=round_up(sum(e for e, _ in shards) * self.n * compute, ALLOCATOR_GRANULE) if shards else 0,
                inp=round_up(sum(e for e, _ in shards) * compute, ALLOCATOR_GRANULE) if shards and compute != sharded else 0,
                rs_in=rs_in,
                rs_out=round_up(sum(grads) * sharded, ALLOCATOR_GRANULE) if grads else 0,
                cast=round_up(sum(grads) * f.reduce_bytes, ALLOCATOR_GRANULE) if grads and f.reduce_bytes != sharded else 0,
            )

        self.units = {path: unit(path, module, unit_nodes[path]) for path, module in order}
        self.order = [path for path, _ in order]
        root_module = max(nodes, key=lambda r: sum(n.cost.parameters for n in r.walk() if id(n) not in self.unit_of)).inst.module
        self.root = unit("<root>", root_module, root_nodes)
        self.root_ids = frozenset(id(n) for n in root_nodes)

    def shard(self, elements: int, rows: int = 0) -> int:
        """Rank 0's elements of a parameter: ceil(rows / dp) rows of it (FSDPParam's
        dim-0 chunk, padded: _fsdp_param.py, FSDPParam._init_sharded_param); without rows
        the parameter is taken as dividing evenly."""
        if rows:
            return -(-rows // self.n) * (elements // rows)
        return -(-elements // self.n)

    def tensors(self, node: Node, setup: Setup) -> list[int]:
        """Rank 0's elements of each of the node's parameters."""
        rows = node.cost.param_rows or (0,) * len(node.cost.param_tensors)
        return [self.shard(t // setup.bytes["param"], r) for t, r in zip(node.cost.param_tensors, rows)]

    def resident(self, node: Node, setup: Setup) -> tuple[int, int]:
        """(sharded parameters, optimizer states) of one node on rank 0: each parameter's
        shard and each state (zeros_like the shard: AdamW's exp_avg and exp_avg_sq) is its
        own allocation, in the sharded dtype."""
        shards = self.tensors(node, setup)
        params = sum(round_up(e * self.sharded, ALLOCATOR_GRANULE) for e in shards)
        if not (node.inst.trainable and node.cost.optimizer_states):
            return params, 0
        n_states = (setup.bytes["optim"] - setup.master_bytes) // setup.state_bytes
        return params, n_states * sum(round_up(e * self.sharded, ALLOCATOR_GRANULE) for e in shards)

    def unit_list(self) -> list[_Unit]:
        return [self.units[p] for p in self.order]

    def previous(self, path: str) -> _Unit | None:
        """The unit that ran forward just before `path`: the one its pre-backward prefetches
        (FSDPParamGroup._backward_prefetch, post_forward_order)."""
        i = self.order.index(path)
        return self.units[self.order[i - 1]] if i > 0 else None

    def step_temporaries(self, nodes: tuple[Node, ...], setup: Setup) -> int:
        """The optimizer's temporaries on the shards: foreach AdamW's _foreach_sqrt copy of
        every exp_avg_sq shard; for-loop AdamW two of the largest; no master gradients
        (the sharded parameters are full precision, their gradients already are).
        NB: with the Trainer's two parameter groups torch sqrts one group's shards at a
        time; counting every shard over-states it by the no-decay group's (biases and
        norm weights, well under 1 % of the shards)."""
        if setup.optimizer.type not in ("adamw", "adam") or setup.optimizer.impl == "fused":
            return 0
        shards = [e for r in nodes for n in r.walk() if n.inst.trainable for e in self.tensors(n, setup)]
        if setup.optimizer.impl == "foreach":
            return sum(round_up(e * self.sharded, ALLOCATOR_GRANULE) for e in shards)
        coupled = setup.optimizer.type == "adam" and setup.optimizer.weight_decay > 0  # grad.add(param): a third copy
        return (3 if coupled else 2) * round_up(max(shards, default=0) * self.sharded, ALLOCATOR_GRANULE)


class _FsdpWalk:
    """FSDP2's allocations along the simulated step, rank 0, in the order the hooks of
    torch/distributed/fsdp/_fully_shard make them (FSDPParamGroup.pre_forward, post_forward,
    pre_backward, post_backward; FSDPState._root_post_backward_final_callback)."""

    def __init__(self, plan: _FsdpPlan, state: _State, blocks: Mapping[int, tuple[int, int, int]]):
        self.plan, self.state, self.blocks = plan, state, blocks
        self.gathered: set[str] = set()  # units whose unsharded parameters are allocated
        self.pending: dict[str, int] = {}  # prefetched all-gather outputs awaiting their copy-out
        self.kept_flat = 0  # the forward's last all-gather output (AllGatherState), freed at the next copy-out
        self.entered: set[str] = set()
        self.rs_kept = 0  # the last reduce-scatter input (reduce_scatter_states, at most 1 kept)

    def _gather(self, unit: _Unit, phase: str, stack) -> None:
        """foreach_all_gather's flat output, then the copy-out into the unsharded parameters.
        In forward the previous unit's flat output is freed only at this unit's copy-out
        (wait_for_unshard, implicit prefetch), so two are alive for a moment."""
        flat = self.pending.pop(unit.path, None)
        if flat is None:
            flat = self._all_gather(unit, phase, stack)
        self.state.add_buffer(FSDP_GATHER, unit.gathered)
        self.gathered.add(unit.path)
        self.state.observe(phase, f"{unit.path} (FSDP copy-out)", stack)
        if phase == "forward":
            # NB: wait_for_unshard clears comm_ctx.all_gather_state, but its local
            # `prev_all_gather_state` holds the previous output until it returns
            self.state.drop_buffer(FSDP_GATHER, self.kept_flat)
            self.kept_flat = flat
        else:
            self.state.drop_buffer(FSDP_GATHER, flat)

    def _all_gather(self, unit: _Unit, phase: str, stack) -> int:
        """The all-gather input (with a mixed-precision policy), then the output."""
        self.state.add_buffer(FSDP_GATHER, unit.inp)
        self.state.add_buffer(FSDP_GATHER, unit.flat)
        self.state.observe(phase, f"{unit.path} (FSDP all-gather)", stack)
        self.state.drop_buffer(FSDP_GATHER, unit.inp)
        return unit.flat

    def _reshard(self, unit: _Unit) -> None:
        if unit.path in self.gathered:
            self.gathered.discard(unit.path)
            self.state.drop_buffer(FSDP_GATHER, unit.gathered)

    def root_pre_forward(self) -> None:
        self._gather(self.plan.root, "forward", {})

    def pre_forward(self, node: Node, stack) -> None:
        path = node.inst.path
        self.entered.add(path)
        if path not in self.gathered:
            self._gather(self.plan.units[path], "forward", stack)

    def post_forward(self, node: Node) -> None:
        self.entered.discard(node.inst.path)
        if self.plan.reshard:
            self._reshard(self.plan.units[node.inst.path])

    def root_post_forward(self) -> None:
        # FSDPState._post_forward of the root frees the last all-gather output; the root
        # itself stays unsharded for backward (its post_forward_mesh_info is None)
        self.state.drop_buffer(FSDP_GATHER, self.kept_flat)
        self.kept_flat = 0

    def _prefetch(self, unit: _Unit | None, stack) -> None:
        if unit is None or unit.path in self.gathered or unit.path in self.pending:
            return
        self.pending[unit.path] = self._all_gather(unit, "backward", stack)

    def root_pre_backward(self) -> None:
        order = self.plan.unit_list()
        self._prefetch(order[-1] if order else None, {})

    def pre_backward(self, node: Node, stack) -> None:
        if not node.inst.grad_flows:
            return  # NB: no output of the unit requires grad: no pre-backward hook
        unit = self.plan.units[node.inst.path]
        if unit.path not in self.gathered:
            self._gather(unit, "backward", stack)
        self._prefetch(self.plan.previous(unit.path), stack)

    def post_backward(self, unit: _Unit, stack) -> None:
        """FSDPParamGroup.post_backward: reshard, release the previous reduce-scatter input,
        then foreach_reduce: the input (the unsharded gradients copied in, then freed), the
        output (the sharded gradient, kept), the input kept until the next unit's."""
        if not any(n.inst.grad_flows for n in unit.nodes[:1]) and unit is not self.plan.root:
            return
        self._reshard(unit)
        self.state.drop_buffer(FSDP_REDUCE, self.rs_kept)
        self.rs_kept = 0
        if not unit.rs_in:
            return
        state = self.state
        state.add_buffer(FSDP_REDUCE, unit.rs_in)
        state.observe("backward", f"{unit.path} (FSDP reduce-scatter)", stack)
        for n in unit.nodes:
            state.drop_grad(n.inst.module, n.inst.path, self.blocks[id(n)][1] if n.cost.gradients else 0)
        state.add_buffer(FSDP_REDUCE, unit.cast)
        state.add_grad(unit.module, f"{unit.path} (sharded gradients)", unit.rs_out)
        state.observe("backward", f"{unit.path} (FSDP reduce-scatter)", stack)
        state.drop_buffer(FSDP_REDUCE, unit.cast)
        self.rs_kept = unit.rs_in

    def root_post_backward(self) -> None:
        """The final callback: the root's post_backward, the units no backward reached
        resharded, prefetched outputs dropped (finalize_backward), the last reduce-scatter
        input released."""
        self.post_backward(self.plan.root, {})
        for unit in self.plan.unit_list():
            self._reshard(unit)
        for flat in self.pending.values():
            self.state.drop_buffer(FSDP_GATHER, flat)
        self.pending.clear()
        self.state.drop_buffer(FSDP_REDUCE, self.rs_kept)
        self.rs_kept = 0
