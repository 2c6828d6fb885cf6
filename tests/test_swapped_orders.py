"""The replay's orders (compiler/pipeline/orders.py): in a swapped order only neighbouring
allocations trade places, and a result handed on keeps its block for the tensor its reader
saves, so every allocated figure of the replay stays what it was and only the layout can
move; reserved is the largest over orders.ORDERS."""

from __future__ import annotations

from compiler.memory.allocator import Allocator, AllocatorConfig
from compiler.pipeline.orders import ORDERS, Order, handed_on, swapped_neighbours
from compiler.pipeline.walks.timeline import PROBE

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


def test_a_result_handed_on_keeps_its_block_for_its_reader():
    """A norm's order: its saved fp32 copy, a transient, its result (an `output`), the
    transient freed, then the result freed as the order ends; its reader then allocates the
    tensor it saves, the result's size. Handed on, that tensor is the result's allocation
    renamed: its free and the reader's allocation are left out, nothing else moves."""
    x32, scaled, result, attn_in = ("tensor", "x32"), ("transient", "scaled", 1), ("output", "result", 2), ("tensor", "attn_in")
    hold = ("transient", "self_attn", 3)
    events = [(x32, 28 * MIB), (scaled, 28 * MIB), (result, 14 * MIB), (scaled, None), (result, None), (hold, 1 * MIB), (attn_in, 14 * MIB), (hold, None)]
    assert handed_on(events) == [(x32, 28 * MIB), (scaled, 28 * MIB), (attn_in, 14 * MIB), (scaled, None), (hold, 1 * MIB), (hold, None)]
    # a reader saving a tensor of another size (in 512-byte blocks) does not take it
    other = [*events[:6], (attn_in, 15 * MIB), (hold, None)]
    assert handed_on(other) == other
    # only the first saved tensor after the free is the reader's: a later one of the size is not
    later = [*events[:6], (("tensor", "q_rot"), 2 * MIB), (attn_in, 14 * MIB), (hold, None)]
    assert handed_on(later) == later
    # a block of 14 MiB + 100 B is 14 MiB + 512 B, as the reader's 14 MiB + 400 B
    odd = [(result, 14 * MIB + 100), (result, None), (attn_in, 14 * MIB + 400)]
    assert handed_on(odd) == [(attn_in, 14 * MIB + 100)]


def test_handed_on_moves_reserved_and_never_allocated():
    """A cache of two free segments, 40 and 12 MiB. A layer's transient takes the 12 MiB one,
    its 12 MiB result the 40 MiB one (28 MiB left beside it); both are freed, the result's
    block merging back into a whole 40 MiB. Made anew, the reader's 12 MiB tensor takes the
    12 MiB segment (best fit) and a 40 MiB request finds the 40 MiB one: 52 MiB reserved.
    Handed on, the tensor is the result's block, and the 40 MiB request finds 28 and 12 MiB
    free: a segment of its own, 92 MiB. Allocated peaks at 52 MiB either way."""
    warm = [(("w", 1), 40 * MIB), (("w", 2), 12 * MIB), (("w", 1), None), (("w", 2), None)]
    tmp, result, saved, big = ("transient", "t", 1), ("output", "result", 2), ("tensor", "attn_in"), ("tensor", "next")
    events = [(tmp, 12 * MIB), (result, 12 * MIB), (tmp, None), (result, None), (saved, 12 * MIB), (big, 40 * MIB)]
    peaks = []
    for order in (events, handed_on(events)):
        allocator = Allocator(AllocatorConfig())
        allocator.play(warm + order, [], probe_key=PROBE)
        peaks.append((allocator.peak_allocated, allocator.peak_reserved))
    assert peaks == [(52 * MIB, 52 * MIB), (52 * MIB, 92 * MIB)]


def test_the_orders_are_two_swapped_each_with_and_without_results_handed_on():
    assert ORDERS == (Order(0, False), Order(1, False), Order(0, True), Order(1, True))
    assert [o.name for o in ORDERS] == [
        "the formulas' order",
        "swapped order 1",
        "the formulas' order, results handed on",
        "swapped order 1, results handed on",
    ]
    result, saved = ("output", "result", 1), ("tensor", "attn_in")
    events = [(result, 12 * MIB), (result, None), (saved, 12 * MIB)]
    # the orders that hand results on replay the walk and the step handed on (replay.replay);
    # a list with no result in it (the weights, the optimizer's step) is the same either way
    assert handed_on(events) == [(saved, 12 * MIB)]
    assert handed_on(events[2:]) == events[2:]
