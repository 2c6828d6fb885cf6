"""FSDP2 (torch.distributed.fsdp.fully_shard, through accelerate): each parameter sharded on
dim 0; a unit's parameters gathered around its forward and backward, its gradients
reduce-scattered after its backward; the optimizer on the shards.

torch/distributed/fsdp/_fully_shard (torch 2.13); docs/fsdp.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..evaluate import Node
from ..resolve import Setup
from .base import Step, Walk
from .timeline import ALLOCATOR_GRANULE, Row, push, round_up

FSDP_GATHER = Row("fsdp-gather", "parameters")  # breakdown row: FSDP2's gathered parameters and all-gather outputs
FSDP_REDUCE = Row("fsdp-reduce")  # breakdown row: FSDP2's reduce-scatter inputs


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
                path,
                module,
                tuple(members),
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
        copies = self.foreach_copies(nodes, setup)
        if copies is not None:
            return sum(copies)
        shards = self._trainable_shards(nodes, setup)
        coupled = setup.optimizer.type == "adam" and setup.optimizer.weight_decay > 0  # grad.add(param): a third copy
        return (3 if coupled else 2) * round_up(max(shards, default=0) * self.sharded, ALLOCATOR_GRANULE)

    def foreach_copies(self, nodes: tuple[Node, ...], setup: Setup) -> list[int] | None:
        """foreach Adam and AdamW's `_foreach_sqrt` results, one per trainable shard (each the
        shard's bytes, its own block); None for another optimizer. NB: in the walk's order (a
        tied table at lm_head), not named_parameters' (the table first), and every group's at
        once (see step_temporaries): the order moves which cached block a copy lands in."""
        if setup.optimizer.type not in ("adamw", "adam") or setup.optimizer.impl != "foreach":
            return None
        return [round_up(e * self.sharded, ALLOCATOR_GRANULE) for e in self._trainable_shards(nodes, setup)]

    def _trainable_shards(self, nodes: tuple[Node, ...], setup: Setup) -> list[int]:
        """Rank 0's elements of every trainable parameter, in the walk's order."""
        return [e for r in nodes for n in r.walk() if n.inst.trainable for e in self.tensors(n, setup)]


class FsdpWalk(Walk):
    """FSDP2's allocations along the simulated step, rank 0, in the order the hooks of
    torch/distributed/fsdp/_fully_shard make them (FSDPParamGroup.pre_forward, post_forward,
    pre_backward, post_backward; FSDPState._root_post_backward_final_callback)."""

    rank = 10
    exclusive = True

    @classmethod
    def applies(cls, setup: Setup, trainable: int) -> bool:
        return setup.fsdp is not None

    def __init__(self, step: Step) -> None:
        super().__init__(step)
        self.plan = _FsdpPlan(step.nodes, step.setup)
        self.gathered: set[str] = set()  # units whose unsharded parameters are allocated
        self.pending: dict[str, int] = {}  # prefetched all-gather outputs awaiting their copy-out
        self.kept_flat = 0  # the forward's last all-gather output (AllGatherState), freed at the next copy-out
        self.entered: set[str] = set()
        self.rs_kept = 0  # the last reduce-scatter input (reduce_scatter_states, at most 1 kept)

    # ---------------------------------------------------------------- residency: per-parameter shards

    def resident(self, node: Node) -> tuple[int, int]:
        return self.plan.resident(node, self.setup)

    def gradients(self, module: str) -> int:
        plan = self.plan
        return sum(u.rs_out for u in [*plan.unit_list(), plan.root] if u.module == module)

    def resident_blocks(self, node: Node) -> list[int]:
        return [round_up(b, ALLOCATOR_GRANULE) for b in node.cost.buffer_tensors] + [self.plan.resident(node, self.setup)[0]]

    def state_blocks(self, node: Node) -> list[int]:
        return [self.plan.resident(node, self.setup)[1]]

    # ---------------------------------------------------------------- the step

    def before_layer_forward(self, node: Node, stack: Mapping[str, int]) -> None:
        inst = node.inst
        if inst.shard_unit and inst.path not in self.entered:
            # NB: the unit's inputs exist before its pre-forward all-gathers its weights
            gap = sum(b for name, b in node.cost.unit_input if name not in self.state.live)
            self._pre_forward(node, push(stack, inst.module, gap))

    def after_layer_forward(self, node: Node) -> None:
        if node.inst.shard_unit and node.inst.path in self.entered:
            self._post_forward(node)

    def _grad_io(self, node: Node, stack: Mapping[str, int]) -> Mapping[str, int]:
        """NB: around a unit's backward hooks its output's gradient (before) and its input's
        (after) exist: the size of its input."""
        return push(stack, node.inst.module, node.cost.unit_input[0][1] if node.cost.unit_input else 0)

    def before_layer_backward(self, node: Node, stack: Mapping[str, int]) -> None:
        if node.inst.shard_unit:
            self._pre_backward(node, self._grad_io(node, stack))

    def after_layer_backward(self, node: Node, stack: Mapping[str, int]) -> None:
        if node.inst.shard_unit:
            self._post_backward(self.plan.units[node.inst.path], self._grad_io(node, stack))

    def optimizer_step(self) -> Mapping[str, int]:
        return self.step.last_module(self.plan.step_temporaries(self.step.nodes, self.setup))

    def step_allocations(self) -> list | None:
        """foreach Adam and AdamW: the `_foreach_sqrt` results shard by shard, made together and
        freed after the update, as the replay's allocations: one block the size of every shard's
        copy at once needs a free run no step of the caching allocator keeps (LLaVA-1.5-7B at
        dp 2: 12,894 MiB, a segment of its own in step 2, the trace's sequence none)."""
        copies = self.plan.foreach_copies(self.step.nodes, self.setup)
        if copies is None:
            return None
        made = [(("step", 0, i), size) for i, size in enumerate(copies) if size]
        return made + [(key, None) for key, _ in made]

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

    def before_forward(self) -> None:
        self._gather(self.plan.root, "forward", {})

    def _pre_forward(self, node: Node, stack) -> None:
        path = node.inst.path
        self.entered.add(path)
        if path not in self.gathered:
            self._gather(self.plan.units[path], "forward", stack)

    def _post_forward(self, node: Node) -> None:
        self.entered.discard(node.inst.path)
        if self.plan.reshard:
            self._reshard(self.plan.units[node.inst.path])

    def after_forward(self) -> None:
        # FSDPState._post_forward of the root frees the last all-gather output; the root
        # itself stays unsharded for backward (its post_forward_mesh_info is None)
        self.state.drop_buffer(FSDP_GATHER, self.kept_flat)
        self.kept_flat = 0

    def _prefetch(self, unit: _Unit | None, stack) -> None:
        if unit is None or unit.path in self.gathered or unit.path in self.pending:
            return
        self.pending[unit.path] = self._all_gather(unit, "backward", stack)

    def before_backward(self) -> None:
        order = self.plan.unit_list()
        self._prefetch(order[-1] if order else None, {})

    def _pre_backward(self, node: Node, stack) -> None:
        if not node.inst.grad_flows:
            return  # NB: no output of the unit requires grad: no pre-backward hook
        unit = self.plan.units[node.inst.path]
        if unit.path not in self.gathered:
            self._gather(unit, "backward", stack)
        self._prefetch(self.plan.previous(unit.path), stack)

    def _post_backward(self, unit: _Unit, stack) -> None:
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
            state.drop_grad(n.inst.module, n.inst.path, self.step.blocks[id(n)][1] if n.cost.gradients else 0)
        state.add_buffer(FSDP_REDUCE, unit.cast)
        state.add_grad(unit.module, f"{unit.path} (sharded gradients)", unit.rs_out)
        state.observe("backward", f"{unit.path} (FSDP reduce-scatter)", stack)
        state.drop_buffer(FSDP_REDUCE, unit.cast)
        self.rs_kept = unit.rs_in

    def before_step(self) -> None:
        """The final callback: the root's post_backward, the units no backward reached
        resharded, prefetched outputs dropped (finalize_backward), the last reduce-scatter
        input released. NB: autograd runs it as backward ends, before the loop drops the
        loss; it is charged once the loss is dropped."""
        self._post_backward(self.plan.root, {})
        for unit in self.plan.unit_list():
            self._reshard(unit)
        for flat in self.pending.values():
            self.state.drop_buffer(FSDP_GATHER, flat)
        self.pending.clear()
        self.state.drop_buffer(FSDP_REDUCE, self.rs_kept)
        self.rs_kept = 0


WALKS = (FsdpWalk,)
