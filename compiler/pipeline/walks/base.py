"""The hooks every parallelism strategy implements, and what the walks of one estimate share.

Contract: `simulate` builds one `Step` and the `Walk` of every strategy that applies to the
setup (`walks.strategies`), then walks the step and calls each walk's hooks at these moments,
in this order:

    start                       the engine is built (buffers allocated before any step)
    before_forward              the root's forward begins
      before_layer_forward      a layer's forward begins (after a checkpointing unit's input is kept)
      while_running -> bytes    alive while a leaf runs (forward, recomputation and backward)
      after_running             a leaf has run
      after_layer_forward       a layer's forward has ended
    after_forward
    before_backward             (only when something trains, as every hook down to before_step)
    through_backward -> bytes   alive through the whole backward
      before_layer_backward     a layer's backward begins (before a checkpointing unit recomputes)
      layer_gradients           the layer's gradients appear (the placing walk only)
      after_layer_backward      the layer's saved tensors are freed
    after_backward              the engine's end of backward (DeepSpeed's epilogue)
    before_step                 the training loop has dropped the loss
    optimizer_step -> bytes     the step's temporaries, per module, from the walk that steps
      step_allocations          ... as the replay's allocations, when known tensor by tensor
      first_step                ... step 1's optimizer point

One walk places the weights (`exclusive`: the first that applies, by `rank`): it also answers
the residency hooks (`shards`, `resident`, `gradients`, `resident_blocks`, `state_blocks`,
`first_step_states`) and `layer_gradients`. Any number of others add to it. The step is asked
of the walks from the last to the first: the first that answers steps the optimizer (the
optimizer offload, after ZeRO, steps it in host memory). Every hook does nothing by default,
and a hook no walk overrides is never called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

from ..evaluate import Node
from ..resolve import Setup
from .optimizer_step import Stepped, _largest_trainable, stepped_tensors
from .resident import _grad_tensors, _offloaded, _resident_blocks, _state_blocks
from .timeline import Point, State


@dataclass
class Step:
    """What the walks of one estimate share: the layers, the setup, each layer's per-GPU
    (weights, gradients, states) bytes and the ledger (`state`, set once the resident bytes
    are known)."""

    nodes: tuple[Node, ...]
    setup: Setup
    trainable: int  # elements the optimizer steps
    blocks: dict = field(default_factory=dict)  # id(node) -> (weights, gradients, states) per GPU
    state: State | None = None

    @cached_property
    def modules(self) -> tuple[str, ...]:
        return tuple(n.inst.module for n in self.nodes)

    @cached_property
    def stepped(self) -> list[Stepped]:
        return stepped_tensors(self.nodes, self.setup)

    @cached_property
    def largest(self) -> int:
        return _largest_trainable(self.nodes, self.setup)

    def last_module(self, total: int) -> dict[str, int]:
        """NB: the optimizer's temporaries belong to no module; shown under the last one so
        that the breakdown still sums to the total."""
        return {self.modules[-1]: total} if total else {}


class Walk:
    """One strategy's allocations along the simulated step; see the module's docstring."""

    rank = 50  # the order the walks are made and asked in
    exclusive = False  # True: places the weights; the first such walk that applies is the only one

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        return False

    def __init__(self, step: Step) -> None:
        self.step, self.setup = step, step.setup

    @property
    def state(self) -> State:
        return self.step.state

    # ---------------------------------------------------------------- residency (the placing walk)

    def shards(self) -> tuple[int, int, int]:
        """Divisors of (weights, gradients, optimizer states) per GPU."""
        return (1, 1, 1)

    def resident(self, node: Node) -> tuple[int, int]:
        """A layer's (weights, optimizer states) bytes resident on this GPU."""
        p, _, o = self.step.blocks[id(node)]
        return p, o

    def gradients(self, module: str) -> int:
        """The module's gradients on this GPU once backward has made them all."""
        blocks = self.step.blocks
        return sum(blocks[id(n)][1] for r in self.step.nodes if r.inst.module == module for n in r.walk())

    def resident_blocks(self, node: Node) -> list[int]:
        return _resident_blocks(node, self.setup, self.step.blocks, self.shards()[0])

    def state_blocks(self, node: Node) -> list[int]:
        return _state_blocks(node, self.setup, self.step.blocks, self.shards()[2])

    def first_step_states(self) -> dict[str, int]:
        """Per module, the optimizer bytes there before step 1's step() (the rest appear in it)."""
        return {}

    def layer_gradients(self, node: Node, stack: Mapping[str, int]) -> None:
        """The layer's gradients appear, kept until the step: one allocation per tensor
        unsharded, else the layer's share of the flat partition."""
        size = self.step.blocks[id(node)][1]
        pieces = _grad_tensors(node, self.setup) if size and self.shards()[1] == 1 and not _offloaded(self.setup) else None
        self.state.add_grad(node.inst.module, node.inst.path, size, pieces if pieces and sum(pieces) == size else None)

    # ---------------------------------------------------------------- the step

    def start(self) -> None:
        pass

    def before_forward(self) -> None:
        pass

    def before_layer_forward(self, node: Node, stack: Mapping[str, int]) -> None:
        pass

    def while_running(self, node: Node) -> int:
        return 0

    def after_running(self, node: Node) -> None:
        pass

    def after_layer_forward(self, node: Node) -> None:
        pass

    def after_forward(self) -> None:
        pass

    def before_backward(self) -> None:
        pass

    def through_backward(self) -> int:
        return 0

    def before_layer_backward(self, node: Node, stack: Mapping[str, int]) -> None:
        pass

    def after_layer_backward(self, node: Node, stack: Mapping[str, int]) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def before_step(self) -> None:
        pass

    def optimizer_step(self) -> Mapping[str, int] | None:
        """The step's temporaries per module, or None where this walk does not step."""
        return None

    def step_allocations(self) -> list | None:
        """The step's allocations and frees for the replay, or None: the observed moment's."""
        return None

    def first_step_allocations(self, once: list[int]) -> list | None:
        """Step 1's step() for the replay, the states made in it included, or None: the
        states (`state_blocks`) made before the steady step's allocations."""
        return None

    def first_step(self, step: Point, transient: Mapping[str, int]) -> Point:
        """Step 1's optimizer point, given the steady one."""
        return step
