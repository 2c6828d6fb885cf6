"""DeepSpeed ZeRO-1/2 with contiguous_gradients and the optimizer on the GPU: the gradient
partition, the bucket as backward fills it, and the step group by group.

deepspeed/runtime/zero/stage_1_and_2.py (deepspeedai/DeepSpeed at 02aa38c3). A gradient
leaves autograd for the bucket as it appears (ZeRO-2, or ZeRO-1 with overlap_comm:
process_gradients) or after backward (ZeRO-1: engine.backward -> reduce_gradients); the
rank's gradient partition is one allocation (zero12_grads_in_partition), made at the first
reduction.
"""

from __future__ import annotations

from typing import Mapping

from ..evaluate import Node
from ..resolve import ZERO12_ALIGNMENT, Setup
from .base import Step
from .deepspeed import DeepSpeedWalk, _Bucket, _grad_elements
from .optimizer_step import Stepped, param_groups, step_temporaries
from .resident import _offloaded
from .timeline import ALLOCATOR_GRANULE, Point, Row, round_up

ZERO12_GRADS = Row("zero-grad-partition")  # breakdown row: ZeRO-1/2's grads_in_partition, from the first bucket reduction
ZERO12_WAIT = Row("zero-large-grad", transient=True)  # breakdown row: a gradient too large for ZeRO-1/2's bucket, whole until it is reduced


def _zero12_active(setup: Setup) -> bool:
    """ZeRO-1/2 with contiguous_gradients and the optimizer on the GPU: the case whose gradient
    partition, buckets and step stage_1_and_2.py is modelled from here."""
    ds = setup.deepspeed
    return ds is not None and setup.zero in (1, 2) and setup.fsdp is None and not _offloaded(setup) and ds.contiguous_gradients


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


class Zero12Walk(DeepSpeedWalk):
    rank = 30

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        return _zero12_active(setup) and trainable > 0

    def __init__(self, step: Step) -> None:
        super().__init__(step)
        setup = self.setup
        self.hooked = setup.zero == 2 or setup.deepspeed.overlap_comm
        self.part = round_up(zero12_grads_in_partition(setup, step.stepped) * setup.bytes["grad"], ALLOCATOR_GRANULE)
        self.bucket = _Zero12Bucket(setup)

    def layer_gradients(self, node: Node, stack: Mapping[str, int]) -> None:
        if self.hooked:
            self._join(node, stack)
        else:
            super().layer_gradients(node, stack)

    def _flush(self, path: str, stack: Mapping[str, int], waiting: int) -> None:
        """Reduce ZeRO-1/2's bucket; the first reduction makes the gradient partition."""
        state = self.state
        size, large = self.bucket.flush(waiting)
        self._reduce(size, path, stack)
        if self.setup.zero == 2:
            # NB: ZeRO-1's reduce_ipg_grads clears no gradient: a too-large one outside this
            # rank's partition stays whole until the epilogue's _clear_param_grad_only
            # (zero_grad(set_to_none=True) in the older engines); kept for every such gradient
            # (an upper bound: those inside the partition are copied and freed)
            state.drop_buffer(ZERO12_WAIT, large)
        if size and ZERO12_GRADS not in state.buffers:
            state.add_buffer(ZERO12_GRADS, self.part)

    def _join(self, node: Node, stack: Mapping[str, int]) -> None:
        """A layer's gradients join ZeRO-1/2's bucket in backward order, each after the
        reduction it causes (as _IpgBucket.add)."""
        grad = self.setup.bytes["grad"]
        for numel in reversed(_grad_elements(node.cost, self.setup.bytes["param"], grad)):
            if self.bucket.overflows(numel):
                self._flush(node.inst.path, stack, numel)
            if self.bucket.join(numel):
                self.state.add_buffer(ZERO12_WAIT, round_up(numel * grad, ALLOCATOR_GRANULE))

    def after_backward(self) -> None:
        state, bucket = self.state, self.bucket
        if not self.hooked:
            # ZeRO-1 without overlap_comm: reduce_gradients moves the whole gradients through the
            # bucket after backward, in group order; the partition appears at the first
            # reduction. NB: charged with every whole gradient and the largest reduction
            # (an upper bound: each whole gradient is freed as it joins the bucket)
            worst = 0
            for t in self.step.stepped:
                if bucket.overflows(t.elements):
                    worst = max(worst, bucket.flush(0)[0])
                bucket.join(t.elements)
            worst = max(worst, bucket.flush(0)[0])
            self._reduce(worst + self.part, "deepspeed.reduce_gradients", {})
            state.drop_grads()
            state.add_buffer(ZERO12_GRADS, self.part)
        else:
            # independent_gradient_partition_epilogue -> reduce_ipg_grads reduces the rest
            self._flush("deepspeed.reduce_ipg_grads", {}, 0)
            if ZERO12_GRADS not in state.buffers:
                state.add_buffer(ZERO12_GRADS, self.part)
            state.drop_buffer(ZERO12_WAIT, state.buffers.get(ZERO12_WAIT, 0))  # _clear_param_grad_only
        super().after_backward()

    def optimizer_step(self) -> Mapping[str, int]:
        phases = zero12_step_temporaries(self.setup, self.step.stepped)
        if phases["after_partition"] - self.part > phases["with_partition"]:
            # the last group steps once grads_in_partition is freed
            self.state.drop_buffer(ZERO12_GRADS, self.part)
            return {self.step.modules[-1]: phases["after_partition"]}
        return {self.step.modules[-1]: phases["with_partition"]}

    def step_allocations(self) -> list | None:
        return None

    def first_step(self, step: Point, transient: Mapping[str, int]) -> Point:
        """NB: stepped group by group on flat partitions, even at dp 1: step 1's optimizer
        point is the steady one, an upper bound."""
        return step


WALKS = (Zero12Walk,)
