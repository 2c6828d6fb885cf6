"""The replay's swapped orders (simulate.swapped_neighbours): only neighbouring allocations
trade places, so every allocated figure of the replay stays what it was and only the layout
can move; reserved is the largest over the formulas' order and REPLAYED_ORDERS swapped ones."""

from __future__ import annotations

from compiler.memory.allocator import Allocator, AllocatorConfig
from compiler.pipeline.simulate import PROBE, swapped_neighbours

MIB = 1 << 20


def _events() -> list:
    """Three layers of a step: each makes two saved tensors back to back, probes a transient
    and frees the layer before's first tensor; then all are freed."""
    out = []
    for layer in range(3):
        out += [(("a", layer), (10 + layer) * MIB), (("b", layer), (3 + layer) * MIB), (PROBE, 7 * MIB)]
        if layer:
            out.append((("a", layer - 1), None))
    return out + [(("b", layer), None) for layer in range(3)] + [(("a", 2), None)]


def _allocated_levels(events: list) -> list[int]:
    """The live bytes after each free and each probe (the points a swap of two allocations
    cannot cross)."""
    live, level, out = {}, 0, []
    for key, nbytes in events:
        if key == PROBE:
            out.append(level + nbytes)
        elif nbytes is None:
            level -= live.pop(key)
            out.append(level)
        else:
            live[key] = nbytes
            level += nbytes
    return out


def test_a_swapped_order_moves_only_neighbouring_allocations():
    events = _events()
    for seed in range(1, 9):
        order = swapped_neighbours(events, seed)
        assert sorted(order, key=repr) == sorted(events, key=repr)
        # frees and probes keep their places; an allocation moves by one place at most
        assert [i for i, (k, n) in enumerate(order) if n is None or k == PROBE] == [i for i, (k, n) in enumerate(events) if n is None or k == PROBE]
        assert all(order[i] == events[i] or order[i] in events[max(i - 1, 0) : i + 2] for i in range(len(events)))
        assert _allocated_levels(order) == _allocated_levels(events)
    assert swapped_neighbours(events, 1) == swapped_neighbours(events, 1)  # seeded
    assert any(swapped_neighbours(events, seed) != events for seed in range(1, 9))


def test_a_swap_can_move_reserved_and_never_allocated():
    """A cache holding two free segments, 12 and 20 MiB, then 6 MiB, 12 MiB and 14 MiB asked
    for (best fit: the smallest free block that holds the request). In this order the 6 MiB
    takes the 12 MiB segment and the 12 MiB the 20 MiB one, leaving 6 and 8 MiB free: the 14
    MiB opens a segment of its own (46 MiB reserved). With the first two swapped the 12 MiB
    takes the 12 MiB segment, the 6 MiB the 20 MiB one, whose 14 MiB remainder holds the last
    request (32 MiB). Allocated peaks at 32 MiB either way."""
    warm = [(("w", 1), 12 * MIB), (("w", 2), 20 * MIB), (("w", 1), None), (("w", 2), None)]
    first, second, third = (("x",), 6 * MIB), (("y",), 12 * MIB), (("z",), 14 * MIB)
    peaks = []
    for order in ([first, second, third], [second, first, third]):
        allocator = Allocator(AllocatorConfig())
        allocator.play(warm + order, [], probe_key=PROBE)
        peaks.append((allocator.peak_allocated, allocator.peak_reserved))
    assert peaks == [(32 * MIB, 46 * MIB), (32 * MIB, 32 * MIB)]
