"""Pipeline parallelism, 1F1B (Narayanan et al. 2021, section 2.2): the first stage runs pp
forwards before its first backward, so pp - 1 other micro-batches' saved activations are
alive through this one's forward and backward.
"""

from __future__ import annotations

from ..evaluate import Node
from ..resolve import Setup
from .base import Walk
from .timeline import ALLOCATOR_GRANULE, Row, round_up

PIPELINE = Row("pipeline", "activations")  # the breakdown row of the other in-flight micro-batches' activations (1F1B)


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


class PipelineWalk(Walk):
    rank = 110

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        # NB: offloaded activations are not on the GPU between a micro-batch's forward and backward
        return setup.pp > 1 and trainable > 0 and not setup.activation_offloading

    def start(self) -> None:
        self.state.add_buffer(PIPELINE, (self.setup.pp - 1) * _saved_per_microbatch(self.step.nodes))


WALKS = (PipelineWalk,)
