"""The caching allocator model as it was before its default path was inlined (commit 941222e),
kept as the reference tests/test_allocator_fast.py compares compiler/memory/allocator.py with.
Not used by memspec.

PyTorch's CUDA caching allocator, replayed: the segments a step's allocations reserve.

Contract: an `Allocator` takes the allocations and frees of a training step in their order
(`malloc(key, nbytes)`, `free(key)`) and keeps the blocks and segments that the native
caching allocator (`c10/cuda/CUDACachingAllocator.cpp`, torch 2.13) would keep, so that
`peak_allocated` is what `torch.cuda.max_memory_allocated()` reports and `peak_reserved`
what `torch.cuda.max_memory_reserved()` reports. `AllocatorConfig.parse` reads the
PYTORCH_CUDA_ALLOC_CONF syntax (compiler/memory/alloc_conf.py, shared). Pure Python, no torch: the estimator replays its simulated
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
- `expandable_segments:True`: one segment per pool that grows by mapping pages (2 MiB in the
  small pool, 20 MiB in the large) at its end, the free block at its end taken first; any
  block splits when at least 512 B remain.

Assumed, not modelled (each a reason `peak_reserved` can differ from a GPU's):
- one stream: blocks freed on another stream (NCCL's, a side stream's record_stream) would
  wait for it before reuse;
- new small-pool segments get ascending addresses and large-pool ones descending (each new
  one below the last), which decide only among free blocks of one size;
- with expandable segments, `empty_cache` unmaps only the free pages at a segment's end;
- `garbage_collection_threshold` acts, as in torch, only under a memory fraction
  (`per_process_memory_fraction`), and ages a free block by the allocations since its free.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# NB: PYTORCH_CUDA_ALLOC_CONF's parsing and the allocator's sizes are memspec's own: this
# reference keeps only the allocator's rules as they were
from compiler.memory.alloc_conf import (
    _NO_DIVISIONS,
    LARGE_BUFFER,
    MIN_BLOCK,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConfig,
)


def round_size(nbytes: int, config: AllocatorConfig) -> int:
    """`round_size`: the bytes a request of `nbytes` is given."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    if config.roundup_power2_divisions is _NO_DIVISIONS:
        return -(-nbytes // MIN_BLOCK) * MIN_BLOCK
    divisions = config.divisions(nbytes)
    if divisions > 1 and nbytes > MIN_BLOCK * divisions:
        return _next_division(nbytes, divisions)
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


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


class _Block:
    __slots__ = ("ptr", "size", "allocated", "prev", "next", "pool", "freed_at")

    def __init__(self, ptr: int, size: int, pool: "_Pool"):
        self.ptr, self.size, self.pool = ptr, size, pool
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.freed_at = 0


class _Pool:
    """Free blocks of one pool, ordered as BlockComparatorSize orders them: size, address."""

    def __init__(self, small: bool):
        self.small = small
        self.page = SMALL_BUFFER if small else LARGE_BUFFER  # expandable segments: what one mapping adds
        self.order: list[tuple[int, int]] = []
        self.free: dict[int, _Block] = {}
        self.tail: _Block | None = None  # expandable segments: the block at the segment's end
        self.base = 0  # expandable segments: the segment's first address
        self.mapped = 0  # expandable segments: bytes mapped

    def insert(self, block: _Block) -> None:
        bisect.insort(self.order, (block.size, block.ptr))
        self.free[block.ptr] = block

    def remove(self, block: _Block) -> None:
        del self.order[bisect.bisect_left(self.order, (block.size, block.ptr))]
        del self.free[block.ptr]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.order, (size, -1))
        return self.free[self.order[i][1]] if i < len(self.order) else None


@dataclass(frozen=True)
class OutOfMemory:
    """The request the allocator could not serve, even after emptying its cache."""

    event: int  # 0-based index of the allocation among all mallocs
    key: object
    requested: int
    allocated: int
    reserved: int
    capacity: int

    def message(self) -> str:
        gib = 1 << 30
        return (
            f"CUDA out of memory at allocation #{self.event}: tried to allocate {self.requested / gib:.2f} GiB; "
            f"{self.allocated / gib:.2f} GiB allocated, {self.reserved / gib:.2f} GiB reserved of "
            f"{self.capacity / gib:.2f} GiB the allocator may use"
        )


class OutOfMemoryError(Exception):
    def __init__(self, oom: OutOfMemory):
        super().__init__(oom.message())
        self.oom = oom


@dataclass
class Allocator:
    """The native caching allocator of one device and stream. `capacity`: the bytes it may
    reserve (the device's memory less what the context and libraries hold), None for no
    limit. A request it cannot serve raises `OutOfMemoryError`."""

    config: AllocatorConfig = field(default_factory=AllocatorConfig)
    capacity: int | None = None
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    mallocs: int = 0

    def __post_init__(self) -> None:
        self._small, self._large = _Pool(True), _Pool(False)
        self._live: dict[object, _Block] = {}
        self._next_address = 1 << 40  # small-pool segments ascend
        self._large_floor = 1 << 56  # large-pool segments descend (compiler.memory.allocator)
        if self.config.expandable_segments:
            for pool in (self._small, self._large):
                pool.base = self._next_address
                self._next_address += 1 << 50

    @property
    def limit(self) -> int | None:
        """What cudaMalloc may add up to: the capacity times a memory fraction."""
        if self.capacity is None:
            return None
        return int(self.capacity * self.config.per_process_memory_fraction)

    # -- malloc ---------------------------------------------------------------------------

    def malloc(self, key: object, nbytes: int) -> int:
        """Allocate `nbytes` for `key` (each key live once); the block's size is returned."""
        if key in self._live:
            raise KeyError(f"{key!r} is already allocated")
        size, pool = self._request(nbytes)
        self.mallocs += 1
        block = self._cached(pool, size)
        if block is None:
            self._collect_garbage()
            block = (
                self._new_block(pool, size)
                or (self._release_oversize(pool, size) and self._new_block(pool, size))
                or (self.empty_cache() and self._new_block(pool, size))
            )
            if not block:
                raise OutOfMemoryError(OutOfMemory(self.mallocs - 1, key, nbytes, self.allocated, self.reserved, self.limit))
        block = self._split(block, size)
        block.allocated = True
        self._live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.size

    def probe(self, nbytes: int) -> None:
        """An allocation freed at once, nothing allocated between: the same as `malloc` then
        `free`, cheaper. A cached block that fits would be split and merged back unchanged;
        only a new segment (kept, free) or an out-of-memory changes anything."""
        size, pool = self._request(nbytes)
        self.mallocs += 1
        block = self._cached(pool, size)
        if block is not None:
            pool.insert(block)
            return
        self.mallocs -= 1  # NB: malloc counts it
        self.malloc(_PROBE, nbytes)
        self.free(_PROBE)

    def _request(self, nbytes: int) -> tuple[int, _Pool]:
        """`round_size` and `get_pool`: the rounded size and the pool it comes from."""
        size = round_size(nbytes, self.config)
        return size, (self._small if size <= SMALL_SIZE else self._large)

    def _cached(self, pool: _Pool, size: int) -> _Block | None:
        """`get_free_block`: the smallest cached block that fits, unless it is oversize."""
        block = pool.best_fit(size)
        if block is None:
            return None
        split_max = self.config.max_split_size
        if split_max is not None:
            if size < split_max <= block.size:
                return None
            if size >= split_max and block.size >= size + self.config.max_non_split_rounding:
                return None
        pool.remove(block)
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
        page = pool.page
        tail = pool.tail
        have = tail.size if tail is not None and not tail.allocated else 0
        grow = -(-(size - have) // page) * page
        if self.limit is not None and self.reserved + grow > self.limit:
            return None
        self._grow(grow)
        end = pool.base + pool.mapped
        pool.mapped += grow
        if have:
            pool.remove(tail)
            tail.size += grow
            return tail
        block = _Block(end, grow, pool)
        block.prev = tail
        if tail is not None:
            tail.next = block
        pool.tail = block
        return block

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
        if not split:
            return block
        rest = _Block(block.ptr + size, remaining, block.pool)
        rest.prev, rest.next = block, block.next
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = size
        if block.pool.tail is block:
            block.pool.tail = rest
        rest.freed_at = self.mallocs
        block.pool.insert(rest)
        return block

    # -- free -----------------------------------------------------------------------------

    def free(self, key: object) -> None:
        """`free_block`: the block returns to its pool, merged with free neighbours."""
        block = self._live.pop(key)
        block.allocated = False
        self.allocated -= block.size
        pool = block.pool
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated:
                continue
            pool.remove(neighbour)
            if neighbour is block.prev:
                block.ptr = neighbour.ptr
                block.prev = neighbour.prev
                if neighbour.prev is not None:
                    neighbour.prev.next = block
            else:
                block.next = neighbour.next
                if neighbour.next is not None:
                    neighbour.next.prev = block
                if pool.tail is neighbour:
                    pool.tail = block
            block.size += neighbour.size
        block.freed_at = self.mallocs
        pool.insert(block)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    @property
    def live(self):
        """The keys allocated now (a read-only view, for a replay's hot loop)."""
        return self._live.keys()

    # -- giving memory back -----------------------------------------------------------------

    def empty_cache(self) -> bool:
        """`release_cached_blocks`: every wholly free segment goes back to the device (with
        expandable segments, the free pages at each segment's end). True if any did."""
        before = self.reserved
        for pool in (self._small, self._large):
            if self.config.expandable_segments:
                self._unmap_tail(pool)
                continue
            for block in [b for b in pool.free.values() if b.prev is None and b.next is None]:
                self._release(block)
        return self.reserved < before

    def _release(self, block: _Block) -> None:
        block.pool.remove(block)
        self.reserved -= block.size

    def _unmap_tail(self, pool: _Pool) -> None:
        tail = pool.tail
        if tail is None or tail.allocated:
            return
        page = pool.page
        keep = -(-(tail.ptr - pool.base) // page) * page - (tail.ptr - pool.base)
        gone = tail.size - keep
        if gone <= 0:
            return
        pool.remove(tail)
        pool.mapped -= gone
        self.reserved -= gone
        if keep:
            tail.size = keep
            pool.insert(tail)
        else:
            pool.tail = tail.prev
            if tail.prev is not None:
                tail.prev.next = None

    def _release_oversize(self, pool: _Pool, size: int) -> bool:
        """`release_available_cached_blocks`: with max_split_size_mb, free one cached
        oversize block that fits, else the largest oversize ones until enough is freed."""
        split_max = self.config.max_split_size
        if split_max is None or pool.small or self.config.expandable_segments:
            return False
        want = max(size, split_max)
        i = bisect.bisect_left(pool.order, (want, -1))
        if i < len(pool.order):
            self._release(pool.free[pool.order[i][1]])
            return True
        freed = 0
        while freed < want and pool.order and pool.order[-1][0] >= split_max:
            block = pool.free[pool.order[-1][1]]
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
