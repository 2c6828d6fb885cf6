"""PyTorch's CUDA caching allocator, replayed: the segments a step's allocations reserve.

Contract: an `Allocator` takes the allocations and frees of a training step in their order
(`malloc(key, nbytes)`, `free(key)`) and keeps the blocks and segments that the native
caching allocator (`c10/cuda/CUDACachingAllocator.cpp`, torch 2.13) would keep, so that
`peak_allocated` is what `torch.cuda.max_memory_allocated()` reports and `peak_reserved`
what `torch.cuda.max_memory_reserved()` reports. `AllocatorConfig.parse` reads the
PYTORCH_CUDA_ALLOC_CONF syntax. Pure Python, no torch: the estimator replays its simulated
step through it, the tracer the storages of a traced one.

The rules, each from the function of CUDACachingAllocator.cpp it restates:
- `round_size`: a request rounds up to a multiple of 512 B (kMinBlockSize), or, where
  `roundup_power2_divisions` gives its size interval n > 1 divisions and the request is over
  512 n B, up to the next of n equal steps between two powers of two.
- `get_pool`: rounded requests up to 1 MiB (kSmallSize) come from the small pool, the rest
  from the large pool; each pool keeps its free blocks ordered by (size, address), and a
  request takes the smallest that fits (`get_free_block`, best fit).
- `get_free_block` with `max_split_size_mb`: a request below it never takes a cached block of
  that size or more, and a request of that size or more takes one only if it is less than
  `max_non_split_rounding_mb` (20 MiB by default) larger.
- `get_allocation_size`: a new segment is 2 MiB (kSmallBuffer) for the small pool, 20 MiB
  (kLargeBuffer) for requests under 10 MiB (kMinLargeAlloc), else the request rounded up to
  2 MiB (kRoundLarge).
- `shouldSplit`: a small-pool block splits when at least 512 B would remain; a large-pool
  block when more than 1 MiB would remain and the request is under `max_split_size`.
  Unsplit, the whole block is the allocation: `max_memory_allocated` counts block sizes.
- `free_block` / `try_merge_blocks`: a freed block merges with free neighbours of its
  segment; segments are only given back by `release_cached_blocks` (empty_cache), which
  `malloc` runs before raising out-of-memory, after `release_available_cached_blocks`
  (oversize blocks only, with `max_split_size_mb`).
- `expandable_segments:True`: one segment of address space per pool, mapped in pages (2 MiB in
  the small pool, 20 MiB in the large). `get_free_block` counts a free block followed by
  unmapped space as the size it can grow to, so it takes the free end of the segment only
  where no other cached block fits; `try_allocate_expandable_block` maps the lowest unmapped
  range with room, joined to the free block before it; any block splits when at least 512 B
  remain; `empty_cache` unmaps the whole pages inside every free block (`unmap_block`).

Assumed, not modelled (each a reason `peak_reserved` can differ from a GPU's):
- one stream: blocks freed on another stream (NCCL's, a side stream's record_stream) would
  wait for it before reuse;
- the addresses cudaMalloc gives, which decide among free blocks of one size (best fit takes
  the lowest): a new large-pool segment is placed below every earlier one and a new
  small-pool segment above, as the CUDA driver placed them on an H200 (torch 2.11, CUDA 13.0;
  six histories of `memspec measure --device cuda --memory-history`: in five every segment
  over 20 MiB came at a lower address than the one before, in the sixth 383 of 438). With
  ascending large-pool addresses the model reserved 5 % and 7 % less than the GPU on the
  GPU's own allocation sequences of Qwen2.5-0.5B with eager attention and checkpointing,
  whose attention scores leave equal-sized blocks cached in several segments; with
  descending ones all six agree with the GPU to the byte (tests/test_measure_history.py);
- `garbage_collection_threshold` acts, as in torch, only under a memory fraction
  (`per_process_memory_fraction`), and ages a free block by the allocations since its free.
"""

from __future__ import annotations

import bisect
from bisect import bisect_left as _bisect_left, insort as _insort
from dataclasses import dataclass, field

from .alloc_conf import (
    _NO_DIVISIONS,
    LARGE_BUFFER,
    MIB,
    MIN_BLOCK,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocConfError,
    AllocatorConfig,
)

# NB: AllocConfError, AllocatorConfig and MIB are read from here too (the model's settings)
__all__ = ["AllocConfError", "AllocatorConfig", "Allocator", "MIB", "OutOfMemory", "OutOfMemoryError", "Replay", "allocation_size", "replay", "round_size"]

# The name a traced record's `emulation` gives this model's placement of new large segments
# (below the others, as the GPU allocator histories show): a record without it was replayed
# with ascending addresses (compiler.measure.record.older_replay)
SEGMENTS_DESCENDING = "cudamalloc-large-segments-descending"


_BLOCK_MASK = MIN_BLOCK - 1  # NB: kMinBlockSize is a power of two: (n + _BLOCK_MASK) & _BLOCK_ROUND rounds up to it
_BLOCK_ROUND = ~_BLOCK_MASK


def round_size(nbytes: int, config: AllocatorConfig) -> int:
    """`round_size`: the bytes a request of `nbytes` is given."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    if config.roundup_power2_divisions is _NO_DIVISIONS:
        return (nbytes + _BLOCK_MASK) & _BLOCK_ROUND
    divisions = config.divisions(nbytes)
    if divisions > 1 and nbytes > MIN_BLOCK * divisions:
        return _next_division(nbytes, divisions)
    return (nbytes + _BLOCK_MASK) & _BLOCK_ROUND


def _next_division(size: int, divisions: int) -> int:
    """`roundup_power2_next_division`: the next of `divisions` steps above a power of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    below = size & ~(step - 1)
    return size if below == size else below + step


def allocation_size(size: int) -> int:
    """`get_allocation_size`: the segment cudaMalloc is asked for when nothing cached fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


_PROBE = ("probe",)
# expandable segments: a segment's address space where the device's memory is not known (the
# model's own choice, more than any step maps). torch reserves 1 1/8 of the device's memory
# (cudaDeviceProp.totalGlobalMem) per segment (`find_expandable_block`): its size decides which
# of two free blocks best fit takes, as the unmapped rest after one counts (`_expandable_size`)
UNBOUNDED_ADDRESS_SPACE = 1 << 46


class _Block:
    __slots__ = ("ptr", "size", "allocated", "prev", "next", "pool", "freed_at", "mapped")

    def __init__(self, ptr: int, size: int, pool: "_Pool"):
        self.ptr, self.size, self.pool = ptr, size, pool
        self.allocated = False
        self.mapped = True  # expandable segments: False for address space with no pages behind it
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.freed_at = 0


def _expandable_size(block: "_Block") -> int:
    """get_free_block's `expandable_size`: a free block and the unmapped range after it."""
    after = block.next
    return block.size + (after.size if after is not None and not after.mapped else 0)


def _least_growing(order: list[int], free: dict, i: int) -> int:
    """get_free_block under expandable segments, from the best fit `order[i]`: the next block
    in the pool's order while it can grow to less (`expandable_size`); its index."""
    grows = _expandable_size(free[order[i] & _PTR_MASK])
    while i + 1 < len(order) and (after := _expandable_size(free[order[i + 1] & _PTR_MASK])) < grows:
        grows, i = after, i + 1
    return i


def _unmapped(block: "_Block") -> "_Block":
    """`block` made address space with no pages behind it; NB: marked allocated too, so that
    no free block merges with it (try_merge_blocks joins only blocks alike in `mapped`)."""
    block.mapped, block.allocated = False, True
    return block


def _link(block: "_Block", before: "_Block | None", after: "_Block | None") -> None:
    """Put `block` between two neighbours of a segment."""
    block.prev, block.next = before, after
    if before is not None:
        before.next = block
    if after is not None:
        after.prev = block


def _merge(block: "_Block") -> "_Block":
    """`try_merge_blocks` with both neighbours: a free block takes in the free ones beside it,
    an unmapped range the unmapped ones (their pool entries dropped); `block` is returned."""
    pool = block.pool
    for side in (block.prev, block.next):
        if side is None or side.mapped != block.mapped or (side.mapped and side.allocated):
            continue
        if side.mapped:
            pool.remove(side)
        else:
            pool.drop_hole(side)
        if side is block.prev:
            block.ptr = side.ptr
            _link(block, side.prev, block.next)
        else:
            _link(block, block.prev, side.next)
        block.size += side.size
    return block


# A free block's place in its pool's order is one integer, size then address (addresses are
# below 2 ** 64): ints compare in C where (size, address) tuples compared element by element
# were most of a replay's bisections.
_PTR_BITS = 64
_PTR_MASK = (1 << _PTR_BITS) - 1


class _Pool:
    """Free blocks of one pool, ordered as BlockComparatorSize orders them: size, address
    (`order` holds `size << _PTR_BITS | ptr`)."""

    def __init__(self, small: bool):
        self.small = small
        self.page = SMALL_BUFFER if small else LARGE_BUFFER  # expandable segments: what one mapping adds
        self.order: list[int] = []
        self.free: dict[int, _Block] = {}
        self.end = 0  # expandable segments: where the next segment's address space begins
        # expandable segments: the unmapped ranges (`pool.unmapped`), by address; the last is
        # the rest of the segment's address space
        self.unmapped: list[int] = []
        self.holes: dict[int, _Block] = {}

    def insert(self, block: _Block) -> None:
        bisect.insort(self.order, block.size << _PTR_BITS | block.ptr)
        self.free[block.ptr] = block

    def remove(self, block: _Block) -> None:
        del self.order[bisect.bisect_left(self.order, block.size << _PTR_BITS | block.ptr)]
        del self.free[block.ptr]

    def add_hole(self, block: _Block) -> None:
        bisect.insort(self.unmapped, block.ptr)
        self.holes[block.ptr] = block

    def drop_hole(self, block: _Block) -> None:
        del self.unmapped[bisect.bisect_left(self.unmapped, block.ptr)]
        del self.holes[block.ptr]

    def entries(self) -> list[tuple[int, int]]:
        """The free blocks' (size, address), in order."""
        return [(k >> _PTR_BITS, k & _PTR_MASK) for k in self.order]


@dataclass(frozen=True)
class OutOfMemory:
    """The request the allocator could not serve, even after emptying its cache."""

    event: int  # 0-based index of the allocation among all mallocs
    key: object
    requested: int
    allocated: int
    reserved: int
    capacity: int | None  # None: no limit was set, and the request is more than an expandable segment's address space

    def message(self) -> str:
        gib = 1 << 30
        head = f"CUDA out of memory at allocation #{self.event}: tried to allocate {self.requested / gib:.2f} GiB; {self.allocated / gib:.2f} GiB allocated, "
        if self.capacity is None:
            return head + f"{self.reserved / gib:.2f} GiB reserved; more than an expandable segment's address space (1 1/8 of the device's memory)"
        return head + f"{self.reserved / gib:.2f} GiB reserved of {self.capacity / gib:.2f} GiB the allocator may use"


class OutOfMemoryError(Exception):
    def __init__(self, oom: OutOfMemory):
        super().__init__(oom.message())
        self.oom = oom


@dataclass
class Allocator:
    """The native caching allocator of one device and stream. `capacity`: the bytes it may
    reserve (the device's memory less what the context and libraries hold), None for no
    limit. `device_memory`: the device's memory as CUDA reports it (totalGlobalMem), which
    sizes an expandable segment's address space; None for a space no step fills. A request
    it cannot serve raises `OutOfMemoryError`."""

    config: AllocatorConfig = field(default_factory=AllocatorConfig)
    capacity: int | None = None
    device_memory: int | None = None
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    mallocs: int = 0

    def __post_init__(self) -> None:
        self._small, self._large = _Pool(True), _Pool(False)
        c = self.config
        # NB: play's own malloc serves the default configuration and expandable segments alone
        self._inline = not any(c.roundup_power2_divisions) and c.max_split_size is None
        self._plain = self._inline and not c.expandable_segments
        self._live: dict[object, _Block] = {}
        self._next_address = 1 << 40  # the small pool's next segment, ascending
        self._large_floor = 1 << 56  # the large pool's lowest segment so far, descending
        if self.config.expandable_segments:
            for pool in (self._small, self._large):
                pool.end = self._next_address
                self._next_address += 1 << 52
                self._new_segment(pool)

    @property
    def limit(self) -> int | None:
        """What cudaMalloc may add up to: the capacity times a memory fraction."""
        if self.capacity is None:
            return None
        return int(self.capacity * self.config.per_process_memory_fraction)

    # -- malloc ---------------------------------------------------------------------------

    def malloc(self, key: object, nbytes: int) -> int:
        """Allocate `nbytes` for `key` (each key live once); the block's size is returned."""
        live = self._live
        if key in live:
            raise KeyError(f"{key!r} is already allocated")
        if not self._plain:
            return self._malloc(key, nbytes)
        self.play(((key, nbytes),), [], None)
        return live[key].size

    def _malloc(self, key: object, nbytes: int) -> int:
        """`malloc` under any configuration."""
        size, pool = self._request(nbytes)
        self.mallocs += 1
        block = self._cached(pool, size)
        if block is None:
            block = self._fresh(pool, size, key, nbytes)
        block = self._split(block, size)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.size

    def _fresh(self, pool: _Pool, size: int, key: object, nbytes: int) -> _Block:
        """Nothing cached fits: a new segment, after giving cached ones back if need be."""
        self._collect_garbage()
        block = (
            self._new_block(pool, size)
            or (self._release_oversize(pool, size) and self._new_block(pool, size))
            or (self.empty_cache() and self._new_block(pool, size))
        )
        if not block:
            raise OutOfMemoryError(OutOfMemory(self.mallocs - 1, key, nbytes, self.allocated, self.reserved, self.limit))
        return block

    def probe(self, nbytes: int) -> None:
        """An allocation freed at once, nothing allocated between: the same as `malloc` then
        `free`, cheaper. A cached block that fits would be split and merged back unchanged;
        only a new segment (kept, free) or an out-of-memory changes anything."""
        size, pool = self._request(nbytes)
        self.mallocs += 1
        if self._plain:  # NB: best fit finds a block exactly when the largest cached one fits
            if pool.order and pool.order[-1] >> _PTR_BITS >= size:
                return
        block = self._cached(pool, size)
        if block is not None:
            pool.insert(block)
            return
        self.mallocs -= 1  # NB: malloc counts it
        self.malloc(_PROBE, nbytes)
        self.free(_PROBE)

    def largest_free(self, nbytes: int) -> int:
        """The largest cached free block of the pool a request of `nbytes` draws from (0:
        none): what a request that opens a segment could not fit into (a diagnostic)."""
        pool = self._request(nbytes)[1]
        return pool.order[-1] >> _PTR_BITS if pool.order else 0

    def _request(self, nbytes: int) -> tuple[int, _Pool]:
        """`round_size` and `get_pool`: the rounded size and the pool it comes from."""
        size = round_size(nbytes, self.config)
        return size, (self._small if size <= SMALL_SIZE else self._large)

    def _cached(self, pool: _Pool, size: int) -> _Block | None:
        """`get_free_block`: the smallest cached block that fits, unless it is oversize. With
        expandable segments a free block followed by unmapped space counts as the size it can
        grow to (`expandable_size`), so the segment's free end is taken only where no other
        cached block fits."""
        order, free = pool.order, pool.free
        i = bisect.bisect_left(order, size << _PTR_BITS)
        if i == len(order):
            return None
        if self.config.expandable_segments:
            i = _least_growing(order, free, i)
        block = free[order[i] & _PTR_MASK]
        split_max = self.config.max_split_size
        if split_max is not None:
            if size < split_max <= block.size:
                return None
            if size >= split_max and block.size >= size + self.config.max_non_split_rounding:
                return None
        del order[i], free[block.ptr]  # NB: pool.remove, the block's place in the order known
        return block

    def _new_block(self, pool: _Pool, size: int) -> _Block | None:
        """`alloc_block`: a new segment, or more of the expandable one, if the device has room."""
        if self.config.expandable_segments:
            return self._expand(pool, size)
        grow = allocation_size(size)
        if self.limit is not None and self.reserved + grow > self.limit:
            return None
        if pool.small:
            block = _Block(self._next_address, grow, pool)
            self._next_address += grow
        else:
            self._large_floor -= grow
            block = _Block(self._large_floor, grow, pool)
        self._grow(grow)
        return block

    def _expand(self, pool: _Pool, size: int) -> _Block | None:
        """`try_allocate_expandable_block`: the unmapped range `find_expandable_block` gives
        (with the free block before it), mapped page by page until it holds `size`; None where
        the device has no room for a mapping (those made before it stay mapped, free)."""
        candidate = self._expandable_candidate(pool, size)
        if candidate is None:
            return None
        if not candidate.mapped:
            candidate = self._map(candidate, min(candidate.size, size))
        while candidate is not None and candidate.size < size:
            following = candidate.next
            candidate = self._map(following, min(size - candidate.size, following.size))
        if candidate is not None:
            pool.remove(candidate)
        return candidate

    def _expandable_candidate(self, pool: _Pool, size: int) -> _Block | None:
        """`find_expandable_block`: the lowest unmapped range that, with the free block before
        it and the free or unmapped ones after it, spans `size`; else a new segment's, or None
        where `size` is more than a segment's whole address space (1 1/8 of the device's
        memory): no mapping can serve it, and cuMemCreate fails as cudaMalloc would."""
        for ptr in pool.unmapped:
            candidate = pool.holes[ptr]
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev
            block, room = candidate, 0
            while room < size and block is not None and (not block.allocated or not block.mapped):
                room += block.size
                block = block.next
            if room >= size:
                return candidate
        if size > self._address_space(pool):
            return None
        return self._new_segment(pool)

    def _address_space(self, pool: _Pool) -> int:
        """An expandable segment's address space: 1 1/8 of the device's memory, in whole pages."""
        memory = self.device_memory
        return -(-(memory + memory // 8) // pool.page) * pool.page if memory else UNBOUNDED_ADDRESS_SPACE

    def _new_segment(self, pool: _Pool) -> _Block:
        """An expandable segment's address space, nothing mapped: above the pool's others."""
        page = pool.page
        space = self._address_space(pool)
        start = -(-pool.end // page) * page
        hole = _unmapped(_Block(start, space, pool))
        pool.add_hole(hole)
        pool.end = start + space
        return hole

    def _map(self, hole: _Block, nbytes: int) -> _Block | None:
        """`map_block`: pages behind the first `nbytes` of an unmapped range (ranges start on a
        page), merged with the free blocks beside it; None where the device has no room."""
        pool = hole.pool
        grow = -(-nbytes // pool.page) * pool.page
        if self.limit is not None and self.reserved + grow > self.limit:
            return None
        self._grow(grow)
        pool.drop_hole(hole)
        if grow < hole.size:
            rest = _unmapped(_Block(hole.ptr + grow, hole.size - grow, pool))
            _link(rest, hole, hole.next)
            pool.add_hole(rest)
            hole.size = grow
        hole.mapped, hole.allocated, hole.freed_at = True, False, self.mallocs
        block = _merge(hole)
        pool.insert(block)
        return block

    def _unmap(self, block: _Block) -> None:
        """`unmap_block`: the whole pages inside a free block go back to the device; any part
        of a page before or after them stays mapped and free."""
        pool, page = block.pool, block.pool.page
        start = -(-block.ptr // page) * page  # NB: every segment begins on a page
        end = (block.ptr + block.size) // page * page
        if start >= end:
            return
        pool.remove(block)
        if start > block.ptr:
            before = _Block(block.ptr, start - block.ptr, pool)
            before.freed_at = block.freed_at
            _link(before, block.prev, block)
            pool.insert(before)
        if block.ptr + block.size > end:
            after = _Block(end, block.ptr + block.size - end, pool)
            after.freed_at = block.freed_at
            _link(after, block, block.next)
            pool.insert(after)
        block.ptr, block.size = start, end - start
        _unmapped(block)
        self.reserved -= block.size
        pool.add_hole(_merge(block))

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _split(self, block: _Block, size: int) -> _Block:
        """`alloc_found_block`: the remainder stays cached when `shouldSplit` says so."""
        remaining = block.size - size
        if block.pool.small or self.config.expandable_segments:
            split = remaining >= MIN_BLOCK
        else:
            split_max = self.config.max_split_size
            split = (split_max is None or size < split_max) and remaining > SMALL_SIZE
        if split:
            self._split_off(block, size, remaining, self.mallocs)
        return block

    # -- free -----------------------------------------------------------------------------

    def free(self, key: object) -> None:
        """`free_block`: the block returns to its pool, merged with free neighbours."""
        if key not in self._live:
            raise KeyError(key)
        self.play(((key, None),), [], None)

    def play(self, events, made: list, probe_key: object) -> None:
        """Run `events` in order, each `(key, nbytes)` an allocation (`malloc`) or `(key, None)` a free (`free`), `(probe_key,
        nbytes)` a `probe`; an allocation of a key still live is kept, a free of a key not live ignored. `made` collects the keys
        allocated. NB: a replay's hot loop, the one body of `free` and of `malloc` without rounding divisions or a max split size
        (under expandable segments a split keeps 512 B or more of either pool): tests/test_allocator_fast.py holds it equal."""
        live, inline, small_pool, large_pool = self._live, self._inline, self._small, self._large
        expandable, large_keeps = self.config.expandable_segments, (MIN_BLOCK if self.config.expandable_segments else SMALL_SIZE + 1)
        small_order, small_free, large_order, large_free = small_pool.order, small_pool.free, large_pool.order, large_pool.free
        new_block = _Block.__new__
        # NB: the counters live in locals through the loop, written back before anything that reads them and at the end
        allocated, peak_allocated, mallocs = self.allocated, self.peak_allocated, self.mallocs
        for key, nbytes in events:
            if nbytes is None:  # free_block, try_merge_blocks
                block = live.pop(key, None)
                if block is None:
                    continue
                block.allocated = False
                ptr, size, pool = block.ptr, block.size, block.pool
                allocated -= size
                order, free = pool.order, pool.free
                before, after = block.prev, block.next
                if before is not None and not before.allocated:
                    ptr = before.ptr
                    del order[_bisect_left(order, before.size << _PTR_BITS | ptr)]
                    del free[ptr]
                    size += before.size
                    block.ptr = ptr
                    before = block.prev = before.prev
                    if before is not None:
                        before.next = block
                if after is not None and not after.allocated:
                    del order[_bisect_left(order, after.size << _PTR_BITS | after.ptr)]
                    del free[after.ptr]
                    size += after.size
                    after = block.next = after.next
                    if after is not None:
                        after.prev = block
                block.size, block.freed_at = size, mallocs
                _insort(order, size << _PTR_BITS | ptr)
                free[ptr] = block
                continue
            if key is probe_key:
                allocated, peak_allocated, mallocs = self._played((allocated, peak_allocated, mallocs), self.probe, nbytes)
                continue
            if key in live:
                continue
            made.append(key)
            if not inline:  # NB: not through _played: every allocation of such an allocator comes here
                self.allocated, self.peak_allocated, self.mallocs = allocated, peak_allocated, mallocs
                self._malloc(key, nbytes)
                allocated, peak_allocated, mallocs = self.allocated, self.peak_allocated, self.mallocs
                continue
            mallocs += 1
            if nbytes <= SMALL_SIZE:  # NB: rounding keeps a request of 1 MiB or less in the small pool
                size = MIN_BLOCK if nbytes < MIN_BLOCK else (nbytes + _BLOCK_MASK) & _BLOCK_ROUND
                pool, order, free, keeps = small_pool, small_order, small_free, MIN_BLOCK  # shouldSplit: 512 B or more remain
            else:
                size = (nbytes + _BLOCK_MASK) & _BLOCK_ROUND
                pool, order, free, keeps = large_pool, large_order, large_free, large_keeps  # more than 1 MiB remains, or 512 B (above)
            i = _bisect_left(order, size << _PTR_BITS)
            if i < len(order):
                block = free.pop(order.pop(_least_growing(order, free, i) if expandable else i) & _PTR_MASK)
            else:
                self.allocated, self.peak_allocated, self.mallocs = allocated, peak_allocated, mallocs
                block = self._fresh(pool, size, key, nbytes)
            remaining = block.size - size
            if remaining >= keeps:  # NB: _split_off inlined (a block made without __init__, every slot set): a gate run makes two million
                rest = new_block(_Block)
                rest.ptr, rest.size, rest.pool, rest.allocated = block.ptr + size, remaining, pool, False
                rest.mapped, rest.freed_at, rest.prev, rest.next = True, mallocs, block, block.next
                if rest.next is not None:
                    rest.next.prev = rest
                block.next, block.size = rest, size
                _insort(order, remaining << _PTR_BITS | rest.ptr)
                free[rest.ptr] = rest
            block.allocated, live[key] = True, block
            allocated += block.size
            if allocated > peak_allocated:
                peak_allocated = allocated
        self.allocated, self.peak_allocated, self.mallocs = allocated, peak_allocated, mallocs

    def _played(self, counters: tuple[int, int, int], fn, *args) -> tuple[int, int, int]:
        """`fn(*args)` from play's loop (a probe's): the loop's counters (allocated, peak
        allocated, mallocs) written back before it and read again after it."""
        self.allocated, self.peak_allocated, self.mallocs = counters
        fn(*args)
        return self.allocated, self.peak_allocated, self.mallocs

    def _split_off(self, block: _Block, size: int, remaining: int, at: int) -> None:
        """`alloc_found_block`'s split: the block keeps `size`, the rest stays cached (freed at
        malloc count `at`)."""
        pool = block.pool
        rest = _Block(block.ptr + size, remaining, pool)
        after = block.next
        rest.prev, rest.next = block, after
        if after is not None:
            after.prev = rest
        block.next = rest
        block.size = size
        rest.freed_at = at
        _insort(pool.order, remaining << _PTR_BITS | rest.ptr)
        pool.free[rest.ptr] = rest

    def layout(self) -> tuple | None:
        """The cache as a replay goes on from it: each live key's block and each free block, by
        address and size, and the bytes reserved; two equal layouts of one allocator serve the
        same events alike. None where more decides it (rounding divisions, max_split_size,
        expandable segments' mappings, garbage collection's ages, a capacity that releases)."""
        if not self._plain or self.config.garbage_collection_threshold or self.capacity is not None:
            return None
        live = frozenset((key, b.ptr, b.size) for key, b in self._live.items())
        free = frozenset((b.ptr, b.size) for pool in (self._small, self._large) for b in pool.free.values())
        return live, free, self.reserved

    def __contains__(self, key: object) -> bool:
        return key in self._live

    @property
    def live(self):
        """The keys allocated now (a read-only view, for a replay's hot loop)."""
        return self._live.keys()

    # -- giving memory back -----------------------------------------------------------------

    def empty_cache(self) -> bool:
        """`release_cached_blocks`: every wholly free segment goes back to the device (with
        expandable segments, the whole pages inside every free block). True if any did."""
        before = self.reserved
        for pool in (self._small, self._large):
            if self.config.expandable_segments:
                for block in list(pool.free.values()):
                    self._unmap(block)
                continue
            for block in [b for b in pool.free.values() if b.prev is None and b.next is None]:
                self._release(block)
        return self.reserved < before

    def _release(self, block: _Block) -> None:
        block.pool.remove(block)
        self.reserved -= block.size

    def _release_oversize(self, pool: _Pool, size: int) -> bool:
        """`release_available_cached_blocks`: with max_split_size_mb, free one cached
        oversize block that fits, else the largest oversize ones until enough is freed."""
        split_max = self.config.max_split_size
        if split_max is None or pool.small or self.config.expandable_segments:
            return False
        want = max(size, split_max)
        i = bisect.bisect_left(pool.order, want << _PTR_BITS)
        if i < len(pool.order):
            self._release(pool.free[pool.order[i] & _PTR_MASK])
            return True
        freed = 0
        while freed < want and pool.order and pool.order[-1] >> _PTR_BITS >= split_max:
            block = pool.free[pool.order[-1] & _PTR_MASK]
            freed += block.size
            self._release(block)
        return freed >= want

    def _collect_garbage(self) -> None:
        """`garbage_collect_cached_blocks`: over the threshold of a memory fraction, free
        the wholly free segments cached longest, the older half first, until under it."""
        threshold = self.config.garbage_collection_threshold
        if not threshold or self.limit is None or self.config.per_process_memory_fraction >= 1.0:
            return
        target = int(threshold * self.limit)
        while self.reserved > target:
            whole = [b for p in (self._small, self._large) for b in p.free.values() if b.prev is None and b.next is None]
            if not whole:
                return
            ages = [self.mallocs - b.freed_at for b in whole]
            average = sum(ages) / len(ages)
            for block, age in zip(whole, ages):
                if age >= average and self.reserved > target:
                    self._release(block)


@dataclass(frozen=True)
class Replay:
    """What a sequence of allocations and frees did to the allocator."""

    peak_allocated: int
    peak_reserved: int
    oom: OutOfMemory | None = None


def replay(events, config: AllocatorConfig | None = None, capacity: int | None = None) -> Replay:
    """Run `events`, each `(key, nbytes)` for an allocation or `(key, None)` for a free,
    through an allocator; an allocation it cannot serve ends the replay with its `oom`."""
    allocator = Allocator(config or AllocatorConfig(), capacity)
    try:
        for key, nbytes in events:
            if nbytes is None:
                allocator.free(key)
            else:
                allocator.malloc(key, nbytes)
    except OutOfMemoryError as error:
        return Replay(allocator.peak_allocated, allocator.peak_reserved, error.oom)
    return Replay(allocator.peak_allocated, allocator.peak_reserved)
