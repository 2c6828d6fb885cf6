"""PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`) on one rank of a fake process group.

Contract: `mesh(world_size)` starts (or restarts at another size) a process group of the
`fake` backend (torch/testing/_internal/distributed/fake_pg.py: every collective returns at
once and touches no data) with this process as rank 0, and returns a one-dimensional CPU
device mesh over it. `shard(model, exp, mesh)` applies `fully_shard` as accelerate's FSDP2
auto wrap does (accelerate/utils/fsdp_utils.py, fsdp2_prepare_model with the
TRANSFORMER_BASED_WRAP policy): every module whose class is in the model's
`_no_split_modules` (Qwen2DecoderLayer, LlamaDecoderLayer, CLIPEncoderLayer,
CLIPVisionEmbeddings, ...), innermost first, then the root, each with the experiment's
mixed-precision policy and `reshard_after_forward`. The model must hold its full-precision
parameters (fp32 for bf16-mixed): FSDP2 keeps those sharded and all-gathers `param_dtype`
copies for compute.

Rank 0 is measured: with dim-0 padding (FSDP2 shards each parameter's dim 0 in
ceil(dim0 / world_size) rows) it holds the largest shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# experiment precision -> (param_dtype of the policy, dtype the sharded parameters are kept in)
POLICY = {
    "bf16-mixed": (torch.bfloat16, torch.float32),
    "fp16-mixed": (torch.float16, torch.float32),
    "bf16": (None, torch.bfloat16),
    "fp32": (None, torch.float32),
}
REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_WORLD: list[int] = []  # the size of the process group this process has started, if any


def mesh(world_size: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if _WORLD and _WORLD[0] != world_size:
        dist.destroy_process_group()
        _WORLD.clear()
    if not _WORLD:
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
        _WORLD.append(world_size)
    # NB: built outside FakeTensorMode: the mesh reads its rank list on the host
    return init_device_mesh("cpu", (world_size,))


def storage_dtype(precision: str) -> torch.dtype:
    """The dtype the model is built in (and its sharded parameters kept in)."""
    return POLICY[precision][1]


def wrapped_classes(model) -> set[str]:
    return set(getattr(model, "_no_split_modules", None) or ())


def shard(model, exp: dict, device_mesh) -> list[str]:
    """fully_shard the units, then the root; returns the unit paths in wrap order."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cfg = exp["parallel"]["fsdp"]
    param_dtype = POLICY[exp["precision"]][0]
    reduce = cfg.get("reduce_dtype")
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=REDUCE_DTYPES[reduce] if reduce else None)
    kwargs = {"mesh": device_mesh, "mp_policy": policy, "reshard_after_forward": cfg.get("reshard_after_forward", True)}
    classes = wrapped_classes(model)
    units = []
    for name, module in reversed(list(model.named_modules())):
        if module is not model and type(module).__name__ in classes:
            fully_shard(module, **kwargs)
            units.append(name)
    fully_shard(model, **kwargs)
    return units
