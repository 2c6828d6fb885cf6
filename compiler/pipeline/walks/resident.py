"""What stays on a GPU between steps, per layer: its weights, gradients and optimizer states
(fp32 master copies included), whole or in ZeRO's flat partitions.

Contract: `_blocks(node, setup, p_div, g_div, o_div)` gives a layer's per-GPU bytes of
weights, gradients and states, each divided as ZeRO shards it (`_shards`) and less what
DeepSpeed's offload keeps in host memory; `_resident_blocks` and `_state_blocks` give the
same as the allocations the caching allocator's replay makes. FSDP2 shards per parameter
instead (`fsdp._FsdpPlan`).
"""

from __future__ import annotations

from ..evaluate import Node, trained
from ..resolve import Setup
from .optimizer_step import _states
from .timeline import ALLOCATOR_GRANULE, div, round_up


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
            return (0 if _params_offloaded(setup) else div(c.parameters, p_div)) + _persistent_bytes(c, setup, p_div), 0, 0
        return sum(round_up(t, ALLOCATOR_GRANULE) for t in c.param_tensors), 0, 0
    params = sum(round_up(t, ALLOCATOR_GRANULE) for t in c.param_tensors) if p_div == 1 else div(c.parameters, p_div) + _persistent_bytes(c, setup, p_div)
    if not c.gradients:
        grads = 0
    elif g_div == 1:
        grads = sum(round_up(e * setup.bytes["grad"], ALLOCATOR_GRANULE) for e in elements)
    else:
        grads = div(c.gradients, g_div)
    if not c.optimizer_states:
        states = 0
    elif o_div == 1:
        states = sum(
            (round_up(e * setup.master_bytes, ALLOCATOR_GRANULE) if setup.master_bytes else 0)
            + sum(round_up(s.nbytes, ALLOCATOR_GRANULE) for s in _states(setup, e, shape) if not s.paged)
            for e, shape in zip(elements, mine_shapes)
        )
    else:
        states = div(c.optimizer_states, o_div)
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


def _shards(setup: Setup) -> tuple[int, int, int]:
    """Divisors of (parameters, gradients, optimizer states) per GPU under ZeRO."""
    dp, z = setup.dp, setup.zero
    return (dp if z >= 3 else 1, dp if z >= 2 else 1, dp if z >= 1 else 1)


def _resident_blocks(node: Node, setup: Setup, blocks: dict, p_div: int) -> list[int]:
    """A layer's weights and buffers as allocations: each tensor its own where whole, one
    flat partition where ZeRO-3 shards them."""
    c = node.cost
    out = [round_up(b, ALLOCATOR_GRANULE) for b in c.buffer_tensors]
    if p_div == 1 and not (setup.zero == 3 and _offloaded(setup)):
        return out + [round_up(t, ALLOCATOR_GRANULE) for t in c.param_tensors]
    return out + [blocks[id(node)][0]]


def _state_blocks(node: Node, setup: Setup, blocks: dict, o_div: int) -> list[int]:
    """A layer's optimizer states (fp32 master copies included) as allocations: each state
    of each tensor its own, or the layer's share of a flat partition when sharded."""
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


def _grad_tensors(node: Node, setup: Setup) -> list[int]:
    """An unsharded layer's gradients as allocations, one per trained tensor (AccumulateGrad
    sets each parameter's .grad on its own), in the order the formula lists them."""
    c = node.cost
    mine, _ = trained(node.inst, c.param_tensors, c.param_shapes, c.param_names)
    return [round_up(t // setup.bytes["param"] * setup.bytes["grad"], ALLOCATOR_GRANULE) for t in mine]


def _offloaded(setup: Setup) -> bool:
    """DeepSpeed's optimizer offload (zero_optimization.offload_optimizer, cpu or nvme)."""
    return setup.deepspeed is not None and setup.deepspeed.offload_optimizer != "none"


def _params_offloaded(setup: Setup) -> bool:
    """DeepSpeed ZeRO-3's parameter offload (zero_optimization.offload_param, cpu or nvme)."""
    return setup.deepspeed is not None and setup.deepspeed.offload_param != "none"
