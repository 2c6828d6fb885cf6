"""DeepSpeed ZeRO-1/2: the optimizer states (ZeRO-2: and the gradients) in flat partitions,
one rank's share each, and the gradient reduce buckets; what ZeRO-1, 2 and 3 share.

deepspeed/runtime/zero/stage_1_and_2.py and stage3.py. `DeepSpeedWalk` is the walk of a
ZeRO-1/2 setup whose gradient partition is not modelled (`zero12._zero12_active`: the
optimizer offloaded, or contiguous_gradients off): the shares of `resident._shards`, the
buckets allocated when backward starts and freed by the epilogue, and torch's step on the
flat partitions. `zero12.Zero12Walk` and `zero3.Zero3Walk` build on it.
"""

from __future__ import annotations

from typing import Mapping

from ..resolve import DEEPSPEED_STATES_AT_INIT, Setup
from .data_parallel import DataParallelWalk
from .resident import _offloaded
from .timeline import ALLOCATOR_GRANULE, Row, div, round_up

DEEPSPEED = Row("deepspeed")  # the breakdown row of DeepSpeed's gradient buckets
DEEPSPEED_RS = Row("deepspeed-reduce-scatter", transient=True)  # breakdown row: ZeRO-3's reduce-scatter copy of a full bucket


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
            total = sum(div(n.cost.optimizer_states, o_div) for n in walk if not n.children)
        else:
            total = sum(div(n.cost.parameters // setup.bytes["param"] * setup.master_bytes, o_div) for n in walk if not n.children and n.cost.optimizer_states)
        if total:
            out[root.inst.module] = total
    return out


class DeepSpeedWalk(DataParallelWalk):
    rank = 40

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        return setup.deepspeed is not None and setup.zero in (1, 2)

    def first_step_states(self) -> dict[str, int]:
        return _first_step_resident_optimizer(self.step.nodes, self.setup, self.shards()[2])

    def before_backward(self) -> None:
        # DeepSpeed allocates its gradient reduce buckets when backward starts (engine.backward
        # -> optimizer.backward) and keeps them through the step.
        self.state.add_buffer(DEEPSPEED, _bucket_bytes(self.setup))

    def after_backward(self) -> None:
        # the epilogue's _release_ipg_buffers frees the ipg buffers before the step
        self.state.drop_buffer(DEEPSPEED, _bucket_bytes(self.setup))

    def _reduce(self, size: int, path: str, stack: Mapping[str, int]) -> None:
        """The moment a DeepSpeed bucket is reduced: its temporaries (`size`) alive, then gone."""
        self.state.add_buffer(DEEPSPEED_RS, size)
        self.state.observe("backward", path, stack)
        self.state.drop_buffer(DEEPSPEED_RS, size)


WALKS = (DeepSpeedWalk,)
