"""DeepSpeed ZeRO-3: weights, gradients and optimizer states in flat partitions; each layer's
weights gathered while it runs, prefetched ahead and kept for reuse; the gradient bucket's
reduce-scatter; the step sub-group by sub-group.

deepspeed/runtime/zero/stage3.py, partitioned_param_coordinator.py and
runtime/comm/coalesced_collectives.py (deepspeedai/DeepSpeed at 007cca6a).
"""

from __future__ import annotations

from typing import Mapping

from ..evaluate import Node
from ..expand import forward_order
from ..resolve import Setup
from .base import Step
from .deepspeed import DeepSpeedWalk, _Bucket, _grad_elements
from .optimizer_step import Stepped, _trainable_elements, param_groups, step_temporaries
from .resident import _offloaded, _params_offloaded, _persistent
from .timeline import ALLOCATOR_GRANULE, Point, Row, div, round_up

ZERO3_KEPT = Row("zero3-kept", "parameters", transient=True)  # breakdown row: ZeRO-3 layers kept gathered for their reuse (stage3_max_reuse_distance)


def _gathered_bytes(c, setup: Setup, p_div: int, host_copy: bool = False) -> int:
    """What gathering a ZeRO-3 layer adds to its partition: the whole 16-bit weights of its
    parameters that are not persistent (those are gathered already), less the local slice,
    which all_gather_coalesced gathers into place (partition_parameters.py). With
    offload_param the partition is in host memory: the whole weights, plus (`host_copy`) the
    all-gather's GPU copy of the host slice."""
    if _params_offloaded(setup):
        return sum(t + (div(t, p_div) if host_copy else 0) for t in c.param_tensors if not _persistent(setup, t))
    return sum(t - div(t, p_div) for t in c.param_tensors if not _persistent(setup, t))


def zero3_sub_groups(setup: Setup, tensors: list[Stepped]) -> list[int]:
    """Elements of each ZeRO-3 optimizer sub-group of this rank's partition
    (deepspeed/runtime/zero/stage3.py, _create_fp16_sub_groups, called per optimizer parameter
    group: its parameters in order, each adding its partition_numel = ceil(numel / dp); a
    sub-group closes once it reaches sub_group_size, and a group at most that big is one)."""
    limit = setup.deepspeed.sub_group_size
    out = []
    for _, members in param_groups(tensors):
        parts = [div(t.elements, setup.dp) for t in members]
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
    norm = round_up(max(div(t.elements, setup.dp) for t in tensors) * 8, ALLOCATOR_GRANULE)
    phases = {"grad_norm": norm, "flatten_to_fp32": convert, "step": sum(stepping.values())}
    return {"zero3_step": max(phases.values())}


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
            size += sum(round_up(div(n, dp) * self.grad, ALLOCATOR_GRANULE) for n in members)  # partitions .to(dtype)
        if not (len(members) == 1 and members[0] % dp == 0):
            size += round_up(sum(div(n, dp) * dp for n in members) * self.comm, ALLOCATOR_GRANULE)
            pads = sum(1 for n in members for r in range(dp) if min(div(n, dp), max(0, n - r * div(n, dp))) < div(n, dp))
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


class Zero3Walk(DeepSpeedWalk):
    rank = 20

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        return setup.deepspeed is not None and setup.zero == 3

    def __init__(self, step: Step) -> None:
        super().__init__(step)
        setup = self.setup
        # ZeRO-3 allocates the whole gradient partition at initialization (stage3.py,
        # _setup_for_real_optimizer: grad_partitions_flat_buffer, torch.zeros of every parameter's
        # partition_numel in gradient_accumulation_dtype, the model's 16-bit dtype under ZeRO:
        # runtime/engine.py, get_data_types) and keeps it; with optimizer offload it is in host memory.
        # NB: a config's data_types.grad_accum_dtype is not read.
        self.grads_resident = not _offloaded(setup) and step.trainable > 0
        self.ipg = _IpgBucket(setup)
        self.p_div = self.shards()[0]  # NB: the setup's, fixed through the walk (while_running reads it per layer)
        self.gathering = self.p_div > 1 or _params_offloaded(setup)
        # ZeRO-3's reuse: a layer used again within stage3_max_reuse_distance elements stays gathered
        trace = _zero3_trace(step.nodes, setup) if self.gathering else []
        self.keep_after = _reuse_kept(trace, setup.deepspeed.max_reuse_distance) if self.gathering else ()
        self.kept: dict = {}  # id(node) -> bytes kept gathered since its last use
        self.cursor = 0  # the next trace position
        self.keeping: int | None = None  # bytes the leaf now running stays gathered with after it
        # a leaf's parameter tensors' bytes -> (bytes its gather adds while it runs, bytes kept after
        # it): the layers of the same parameter tensors (the decoder layers) gather the same bytes
        self.gathered: dict = {}
        # _prefetch_bytes, unrolled: the whole prefetch bucket while the gathered elements leave room
        self.full_prefetch = _prefetch_bytes(setup, 0) if self.gathering else 0
        self.room = setup.deepspeed.max_live_parameters - setup.deepspeed.prefetch_bucket if self.gathering else 0

    def start(self) -> None:
        if self.grads_resident:
            blocks = self.step.blocks
            for root in self.step.nodes:
                self.state.add_grad(root.inst.module, f"{root.inst.module} (gradient partition)", sum(blocks[id(n)][1] for n in root.walk()))

    def while_running(self, node: Node) -> int:
        """ZeRO-3 gathers a layer's full weights while it runs, and prefetches the next ones.
        NB: a ModulesToSaveWrapper's original_module never runs: nothing is gathered."""
        if node.children or not self.gathering or node.inst.idle:
            return 0
        setup, p_div = self.setup, self.p_div
        tensors = node.cost.param_tensors
        sizes = self.gathered.get(tensors)
        if sizes is None:
            # NB: with offload_param the all-gather's input is a GPU copy of the host partition
            # (partition_parameters.py, all_gather_coalesced: ds_tensor.to(device)); counted
            # while the layer runs (an upper bound: it is freed once the all-gather is issued)
            sizes = self.gathered[tensors] = (_gathered_bytes(node.cost, setup, p_div, host_copy=True), _gathered_bytes(node.cost, setup, p_div))
        if node.cost.parameters:
            k = self.cursor
            self.cursor += 1
            self.keeping = sizes[1] if self.keep_after[k] else None
            if self.kept:
                self.state.drop_buffer(ZERO3_KEPT, self.kept.pop(id(node), 0))
        own = sizes[0]
        available = own + (self.state.buffers.get(ZERO3_KEPT, 0) if self.kept else 0)
        return own + (self.full_prefetch if available // setup.bytes["param"] <= self.room else _prefetch_bytes(setup, available))

    def after_running(self, node: Node) -> None:
        """After a leaf ran: its gathered weights stay if it is used again within the reuse distance."""
        if self.keeping is not None and not node.children:
            self.kept[id(node)] = self.keeping
            self.state.add_buffer(ZERO3_KEPT, self.keeping)
            self.keeping = None

    def layer_gradients(self, node: Node, stack: Mapping[str, int]) -> None:
        if not self.grads_resident:
            super().layer_gradients(node, stack)
        if not node.children:
            for size in self.ipg.add(node.cost):
                # the bucket is reduced while this layer's gradient waits to join it
                self._reduce(size, node.inst.path, stack)

    def after_backward(self) -> None:
        # independent_gradient_partition_epilogue reduces what is left in the bucket
        self._reduce(self.ipg.flush(0), "deepspeed.reduce_scatter", {})

    def optimizer_step(self) -> Mapping[str, int]:
        return self.step.last_module(sum(zero3_step_temporaries(self.setup, self.step.stepped).values()))

    def step_allocations(self) -> list | None:
        return None

    def first_step(self, step: Point, transient: Mapping[str, int]) -> Point:
        """NB: stepped sub-group by sub-group: step 1's optimizer point is the steady one, an
        upper bound."""
        return step


WALKS = (Zero3Walk,)
