"""The parallelism strategies of the simulated step, one walk each; the folder is the registry.

Contract: `strategies(setup, trainable)` gives the walk classes of a setup, in the order they
are asked: the one placing walk that applies first (`Walk.exclusive`, by `Walk.rank`), then
every other one that applies. Each module that defines a strategy lists it in `WALKS`; a new
strategy is a new module here implementing the hooks of `base.Walk`.

    data_parallel  one GPU or DDP: nothing sharded, torch's optimizer (the fallback)
    deepspeed      ZeRO-1/2 whose gradient partition is not modelled; the buckets ZeRO shares
    zero12         ZeRO-1/2 with contiguous gradients: the gradient partition and bucket
    zero3          ZeRO-3: partitions, gathering, prefetch, reuse, the reduce-scatter
    fsdp           FSDP2: per-parameter shards, units gathered and reduce-scattered
    offload        DeepSpeed's optimizer offload: the step in host memory
    pipeline       pipeline parallelism (1F1B): the other micro-batches' activations
    device_map     from_pretrained's device_map: what crosses the GPUs of a split model
                   (simulate walks the step once per GPU with `device_map.on_gpu`)

Beside them: `base` (the hooks and the shared `Step`), `timeline` (the ledger the walks
write: `State`, `Point`), `resident` (per-layer weights, gradients and states on a GPU) and
`optimizer_step` (torch's optimizer.step()).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from ..resolve import Setup
from .base import Walk


@lru_cache(maxsize=1)
def _registry() -> tuple[type[Walk], ...]:
    found: list[type[Walk]] = []
    for info in pkgutil.iter_modules(__path__):
        found += getattr(importlib.import_module(f"{__name__}.{info.name}"), "WALKS", ())
    return tuple(sorted(found, key=lambda cls: (cls.rank, cls.__name__)))


def strategies(setup: Setup, trainable: int) -> list[type[Walk]]:
    """The walks of `setup`, the placing one first."""
    applying = [cls for cls in _registry() if cls.applies(setup, trainable)]
    placing = next(cls for cls in applying if cls.exclusive)
    return [placing] + [cls for cls in applying if not cls.exclusive]
