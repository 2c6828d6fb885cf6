"""Where from_pretrained places a model split across the GPUs of one process: an experiment's
`device_map` and `max_memory`, read as transformers and accelerate read them.

Contract: `read_device_map(data, parallel, complain, file, base, doc)` turns the merged
experiment values (`resolve.Resolution`'s `data` and `parallel`) into a `DeviceMap` (None
without a device_map): the strategy or the explicit map, each `max_memory` size in bytes
(`accelerate_size`), the GPU indices, and what a placement does not combine with; each
problem goes to `complain` at the key or flag that set it (`file` and `base` say where the
device_map was given; `doc` locates its keys). Module names of an explicit map are checked
once the model's modules are known (walks/device_map.py), at the places kept in
`DeviceMap.where`. Part of stage 3 (resolve).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import did_you_mean
from .load import Document, child_path
from .vocabulary import DEVICE_MAP_STRATEGIES, DeviceMap


def read_device_map(data: Mapping[str, Any], parallel: Mapping[str, Any], complain, file: str, base: str, doc: Document | None) -> DeviceMap | None:
    """`device_map` and `max_memory` (from_pretrained's, accelerate's meaning): the strategy
    or the explicit map, each size, the GPU indices; what the placement does not combine
    with."""
    value, memory = data.get("device_map"), data.get("max_memory")
    if value is None:
        if memory is not None:
            complain(
                "max_memory",
                "E332",
                "max_memory without device_map: it bounds what from_pretrained places on each GPU",
                "add device_map: auto (or balanced, balanced_low_0, sequential, or a map of module name -> GPU)",
            )
        return None
    where: dict[str, tuple[str, int, int, str]] = {}

    def locate(key: str, path: str) -> None:
        line, col = doc.where(path) if file and doc is not None else (0, 0)
        where[key] = (file, line, col, path)

    sizes = _max_memory(memory, complain) if memory is not None else []
    explicit: list[tuple[str, int]] = []
    strategy = ""
    if isinstance(value, str):
        if not _strategy_known(value, sizes, memory, complain):
            return None
        strategy = value
    elif isinstance(value, dict) and value:
        explicit = _explicit_map(value, sizes, complain, file, base, locate)
    else:
        complain(
            "device_map",
            "E332",
            f"device_map {value!r} is neither a placement nor a map of module name -> GPU",
            f"use {', '.join(DEVICE_MAP_STRATEGIES)} or a map such as {{model.embed_tokens: 0, model.layers.0: 0, ...}}",
        )
        return None
    _device_map_combinations(data, parallel, complain)
    locate("", base)
    gpus = len(sizes) if sizes else max((g for _, g in explicit), default=0) + 1
    return DeviceMap(strategy, tuple(explicit), tuple(sizes), gpus, tuple(where.items()))


def _strategy_known(value: str, sizes: list[tuple[int, int]], memory: Any, complain) -> bool:
    """A placement strategy from_pretrained knows, given the GPUs' sizes it needs."""
    if value not in DEVICE_MAP_STRATEGIES:
        complain(
            "device_map",
            "E332",
            f"device_map '{value}' is no placement from_pretrained knows",
            did_you_mean(value, list(DEVICE_MAP_STRATEGIES)) or f"use {', '.join(DEVICE_MAP_STRATEGIES)} or a map of module name -> GPU",
        )
        return False
    if not sizes:
        complain(
            "device_map" if memory is None else "max_memory",
            "E332",
            f"device_map '{value}' without max_memory: the GPUs and what each may hold are unknown",
            "add max_memory: one size per GPU, e.g. [20GiB, 20GiB] for two GPUs (accelerate's meaning: the weights each may take)",
        )
        return False
    return True


def _explicit_map(
    value: Mapping[str, Any], sizes: list[tuple[int, int]], complain, file: str, base: str, locate: Callable[[str, str], None]
) -> list[tuple[str, int]]:
    """An explicit map's (module name, GPU index) pairs, each located; every GPU within the
    ones max_memory gives."""
    explicit: list[tuple[str, int]] = []
    for name, gpu in value.items():
        path = child_path(base, name) if file else base
        if isinstance(gpu, str) and gpu in ("cpu", "disk", "meta"):
            complain(
                "device_map",
                "E332",
                f"device_map '{name}': {gpu}: offloading to host memory or disk is not modelled",
                "place every module on a GPU (0, 1, ...)",
            )
            continue
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            complain("device_map", "E332", f"device_map '{name}': {gpu!r} is not a GPU index", "write the GPU's index, e.g. 0")
            continue
        explicit.append((name, gpu))
        locate(name, path)
    gpus = len(sizes) if sizes else max((g for _, g in explicit), default=0) + 1
    for name, gpu in explicit:
        if gpu >= gpus:
            complain(
                "device_map",
                "E332",
                f"device_map '{name}': GPU {gpu} is beyond the {gpus} GPU(s) max_memory gives",
                f"use a GPU from 0 to {gpus - 1}, or give max_memory for {gpu + 1} GPUs",
            )
    return explicit


# accelerate.utils.modeling.convert_file_size_to_int (accelerate 1.15.0): the units a
# `max_memory` size may carry, binary (GiB) or decimal (GB); a decimal unit ending in a
# lowercase b ("5Gb") is bits, an eighth of the bytes.
_ACCELERATE_UNITS = (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))


def accelerate_size(value: Any) -> int:
    """A `max_memory` value in bytes, as accelerate reads it: an integer is bytes, a string a
    number with one of accelerate's units ("20GiB", "500MB"). ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("not a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("negative")
        return value
    if not isinstance(value, str):
        raise ValueError("not a size")
    for unit, factor in _ACCELERATE_UNITS:
        if value.upper().endswith(unit):
            try:
                number = float(value[: -len(unit)])
            except ValueError:
                raise ValueError(f"'{value[: -len(unit)]}' is not a number") from None
            size = int(number * factor)
            if number < 0:
                raise ValueError("negative")
            return size // 8 if len(unit) == 2 and value.endswith("b") else size
    raise ValueError("no unit accelerate reads (GiB, MiB, KiB, GB, MB, KB)")


def _max_memory(memory: Any, complain) -> list[tuple[int, int]]:
    """max_memory as (GPU index, bytes), sorted: a list (GPU 0, 1, ...) or a map of quoted indices."""
    items = list(enumerate(memory)) if isinstance(memory, list) else list(memory.items()) if isinstance(memory, dict) else None
    if items is None:
        complain(
            "max_memory",
            "E332",
            f"max_memory {memory!r} is neither a list nor a map of GPU index -> size",
            "write max_memory: [20GiB, 20GiB] (GPU 0, GPU 1) or {'0': 20GiB, '1': 20GiB}",
        )
        return []
    sizes: list[tuple[int, int]] = []
    for key, size in items:
        index = key if isinstance(key, int) else int(key) if isinstance(key, str) and key.isdigit() else None
        if index is None:
            what = "offloading to host memory or disk is not modelled" if key in ("cpu", "disk", "mps") else "not a GPU index"
            complain("max_memory", "E332", f"max_memory key '{key}': {what}", "give the GPUs' sizes only (0, 1, ...); everything must fit on them")
            continue
        try:
            sizes.append((index, accelerate_size(size)))
        except ValueError as error:
            where = f"[{key}]" if isinstance(key, int) else f".{key}"
            complain(
                "max_memory",
                "E332",
                f"max_memory{where} {size!r} is not a size: {error}",
                "an integer in bytes, or a number and a unit as accelerate reads it: 20GiB (2^30 bytes), 20GB (10^9 bytes), 500MiB",
            )
    sizes.sort()
    if sizes and [i for i, _ in sizes] != list(range(len(sizes))):
        complain(
            "max_memory",
            "E332",
            f"max_memory names GPUs {', '.join(str(i) for i, _ in sizes)}: the GPUs of a process are numbered from 0",
            "give GPUs 0 to N-1",
        )
    return sizes


def _device_map_combinations(data: Mapping[str, Any], parallel: Mapping[str, Any], complain) -> None:
    """What a model split by device_map (one process, unsharded, 16-bit weights) is not estimated with."""
    for key, why in (("zero", parallel["zero"] > 0), ("dp", parallel["dp"] > 1), ("tp", parallel["tp"] > 1), ("pp", parallel["pp"] > 1)):
        if why:
            complain(
                "device_map",
                "E332",
                f"device_map with {key} {parallel[key]}: a model split by device_map runs in one process, unsharded",
                f"set {key}: {0 if key == 'zero' else 1}, or drop device_map",
            )
    if parallel.get("fsdp") is not None:
        complain("device_map", "E332", "device_map with FSDP: a model split by device_map runs in one process, unsharded", "drop fsdp, or drop device_map")
    if data.get("quantization"):
        complain(
            "device_map",
            "E332",
            "device_map with quantized weights is not modelled (the quantizer's sizes and its adjust_max_memory)",
            "estimate the 16-bit model with device_map, or the quantized one on one GPU",
        )
