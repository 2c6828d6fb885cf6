"""PYTORCH_CUDA_ALLOC_CONF as the native caching allocator reads it, and the allocator's sizes.

Contract: `AllocatorConfig.parse(text)` reads the `key:value,key:value` syntax
(c10/core/AllocatorConfig.cpp, torch 2.13) into the settings that change what the allocator
reserves; an option or value torch refuses raises `AllocConfError` naming the key. The
constants are CUDACachingAllocator.cpp's (kMinBlockSize, kSmallSize, ...), which
compiler/memory/allocator.py replays. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

KIB = 1 << 10
MIB = 1 << 20
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 * MIB  # kSmallSize: largest request of the small pool
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: a small-pool segment
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: the segment of a request under kMinLargeAlloc
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge
# CUDAAllocatorConfig: roundup_power2_divisions is kept per power-of-two interval of the
# size, from 1 MiB (kRoundUpPowerOfTwoStart) to 64 GiB (kRoundUpPowerOfTwoEnd), 16 intervals;
# sizes below the first use its entry, sizes above the last its entry.
ROUNDUP_START = 1 * MIB
ROUNDUP_INTERVALS = 16


_NO_DIVISIONS = (0,) * ROUNDUP_INTERVALS


class AllocConfError(ValueError):
    """A PYTORCH_CUDA_ALLOC_CONF key or value the native allocator refuses; `key` names it."""

    def __init__(self, key: str, message: str, help: str | None = None):
        super().__init__(message)
        self.key = key
        self.help = help


@dataclass(frozen=True)
class AllocatorConfig:
    """The settings of PYTORCH_CUDA_ALLOC_CONF that change what the allocator reserves.
    Defaults are torch's: no max split size, 512 B rounding, no garbage collection."""

    max_split_size: int | None = None  # bytes; None: blocks of any size split
    max_non_split_rounding: int = LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = _NO_DIVISIONS
    garbage_collection_threshold: float = 0.0
    per_process_memory_fraction: float = 1.0
    expandable_segments: bool = False
    text: str = ""  # as the user wrote it

    @classmethod
    def parse(cls, text: str) -> "AllocatorConfig":
        """PYTORCH_CUDA_ALLOC_CONF's `key:value,key:value` (a roundup list in brackets)."""
        config = cls(text=text.strip())
        for key, value in _pairs(text):
            parse = _KEYS.get(key)
            if parse is None:
                if key in _IGNORED:
                    continue
                from ..errors import did_you_mean

                raise AllocConfError(
                    key, f"unknown allocator option '{key}'", did_you_mean(key, list(_KEYS) + list(_IGNORED)) or f"options: {', '.join(sorted(_KEYS))}"
                )
            config = parse(config, key, value)
        return config

    @property
    def defaults(self) -> bool:
        """torch's defaults: no PYTORCH_CUDA_ALLOC_CONF setting changes anything."""
        return replace(self, text="") == AllocatorConfig()

    @property
    def only_expandable(self) -> bool:
        """expandable_segments:True and torch's defaults otherwise: the setting the GPU records
        under expandable segments were measured with (the margin of specs/gpus.yaml
        device.margin_pct.expandable_segments, fit's lever)."""
        return replace(self, text="") == AllocatorConfig(expandable_segments=True)

    def describe(self) -> str:
        """The settings as the output shows them: torch's defaults say so."""
        return self.text or "PyTorch's defaults (no PYTORCH_CUDA_ALLOC_CONF)"

    def divisions(self, size: int) -> int:
        """CUDAAllocatorConfig::roundup_power2_divisions: the entry of `size`'s interval."""
        index = max(size.bit_length() - 1 - (ROUNDUP_START.bit_length() - 1), 0)
        return self.roundup_power2_divisions[min(index, ROUNDUP_INTERVALS - 1)]


def _pairs(text: str):
    """Split `a:1,b:[256:1,>:2],c:x` at the commas outside brackets."""
    depth, start, items = 0, 0, []
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    for item in items:
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition(":")
        key = key.strip()
        if not sep or not value.strip():
            raise AllocConfError(key, f"allocator option '{key}' has no value", f"write it as {key}:VALUE")
        yield key, value.strip()


def _number(key: str, value: str, kind=int) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise AllocConfError(key, f"{key}:{value}: not {'an integer' if kind is int else 'a number'}") from None


def _max_split(config: AllocatorConfig, key: str, value: str) -> AllocatorConfig:
    mb = _number(key, value)
    # CUDAAllocatorConfig::parseMaxSplitSize: "must be > kLargeBuffer" (in MB)
    if mb <= LARGE_BUFFER // MIB:
        raise AllocConfError(key, f"{key}:{value}: too small, must be > {LARGE_BUFFER // MIB}")
    return replace(config, max_split_size=mb * MIB)


def _max_non_split(config: AllocatorConfig, key: str, value: str) -> AllocatorConfig:
    mb = _number(key, value)
    if mb <= LARGE_BUFFER // MIB:
        raise AllocConfError(key, f"{key}:{value}: too small, must be > {LARGE_BUFFER // MIB}")
    return replace(config, max_non_split_rounding=mb * MIB)


def _gc_threshold(config: AllocatorConfig, key: str, value: str) -> AllocatorConfig:
    threshold = _number(key, value, float)
    if not 0.0 < threshold < 1.0:
        raise AllocConfError(key, f"{key}:{value}: must be between 0.0 and 1.0, both excluded")
    return replace(config, garbage_collection_threshold=threshold)


def _fraction(config: AllocatorConfig, key: str, value: str) -> AllocatorConfig:
    fraction = _number(key, value, float)
    if not 0.0 < fraction <= 1.0:
        raise AllocConfError(key, f"{key}:{value}: must be in (0.0, 1.0]")
    return replace(config, per_process_memory_fraction=fraction)


def _bool(key: str, value: str) -> bool:
    if value not in ("True", "False"):
        raise AllocConfError(key, f"{key}:{value}: expected True or False", "torch accepts exactly 'True' or 'False'")
    return value == "True"


def _expandable(config: AllocatorConfig, key: str, value: str) -> AllocatorConfig:
    return replace(config, expandable_segments=_bool(key, value))


def _division(key: str, text: str, zero: bool = True) -> int:
    n = _number(key, text)
    if n < 0 or (n & (n - 1)) or (n == 0 and not zero):
        raise AllocConfError(key, f"{key}: {n} divisions is not a power of 2" + (" or 0" if zero else ""))
    return n


def _roundup(config: AllocatorConfig, key: str, value: str) -> AllocatorConfig:
    """c10/core/AllocatorConfig.cpp, parseRoundUpPower2Divisions: one number (a power of two)
    for every size, or a list `[256:1,512:2,>:8]` of interval starts in MiB (powers of two)
    with their divisions (a power of two, 0 for none): the first entry also sets every
    interval below it, each later one only its own, and '>' every interval after the last."""
    if not value.startswith("["):
        n = _division(key, value, zero=False)
        return replace(config, roundup_power2_divisions=(n,) * ROUNDUP_INTERVALS)
    if not value.endswith("]"):
        raise AllocConfError(key, f"{key}:{value}: the list has no closing ']'")
    table = [0] * ROUNDUP_INTERVALS
    last = 0
    first = True
    for item in value[1:-1].split(","):
        size, sep, divisions = item.partition(":")
        size = size.strip()
        if not sep:
            raise AllocConfError(key, f"{key}: '{item}' is not SIZE_MB:DIVISIONS")
        n = _division(key, divisions.strip())
        if size == ">":
            for i in range(last + 1, ROUNDUP_INTERVALS):
                table[i] = n
            continue
        mb = _number(key, size)
        if mb <= 0 or mb & (mb - 1):
            raise AllocConfError(key, f"{key}: size {size} MiB is not a power of 2")
        index = min(mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:
            for i in range(index):
                table[i] = n
            first = False
        table[index] = n
        last = index
    return replace(config, roundup_power2_divisions=tuple(table) if any(table) else _NO_DIVISIONS)


_KEYS = {
    "max_split_size_mb": _max_split,
    "max_non_split_rounding_mb": _max_non_split,
    "garbage_collection_threshold": _gc_threshold,
    "roundup_power2_divisions": _roundup,
    "expandable_segments": _expandable,
    "per_process_memory_fraction": _fraction,
}
# Options torch accepts that do not change what the native allocator reserves
_IGNORED = {
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
}
