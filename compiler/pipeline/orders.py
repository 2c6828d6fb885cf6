"""The orders an estimate's step is replayed in through the caching allocator model; its
reserved is the largest over them (`replay.replay`).

The walk's events are one order of the step's allocations at the grain of its formulas. Two
freedoms of the real step are not fixed by that grain, and each moves which cached block a
later tensor lands in, while every allocated figure stays as it is:

- which of two tensors made back to back a GPU makes first, its kernels' and autograd's
  choice where a formula's order is the formula's (`swapped_neighbours`);
- whether a layer's result keeps its block for the layer that reads it (`handed_on`): on the
  GPU a norm's output (or a LoRA adapter's sum) is the tensor q, k and v (or the MLP) read and
  save, where the walk frees the result as its layer's order ends and its reader allocates its
  saved input anew, which a best fit may place elsewhere.

ORDERS are the formulas' order and one swapped order, each with and without the hand-on:
of the GPU records (benchmarks/replay_orders.py), 22 under by more than 2 % in the formulas'
order alone, 12 over it and two swapped orders, 9 over these four with the norms' results
handed on (Gemma-3-1B b 4 -4.91 % -> -0.05 %, PaliGemma 2 -3.31 % -> +0.04 %, Qwen2.5-VL-7B SGD
under expandable segments -4.12 % -> -1.81 %; Qwen3-VL-2B video +0.16 % -> +11.76 %), 7 with
LoRA adapters' sums too (Phi-3-mini LoRA b 4 eager -3.94 % -> +0.13 %; LLaVA-1.5-7B LoRA under
expandable segments -0.58 % -> +3.99 %), 6 with LayerNorm's result too (Pythia-1.4B LoRA
-4.69 % -> +0.00 %; Qwen2-VL-7B video -0.31 % -> -3.44 %). Each order is one more replay, about a
tenth of an estimate's time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .walks.timeline import ALLOCATOR_GRANULE, PROBE, round_up


@dataclass(frozen=True)
class Order:
    """`seed`: 0 the formulas' order, n `swapped_neighbours` with seed n; `handed`: each
    layer's result handed on to its reader (`handed_on`)."""

    seed: int
    handed: bool

    @property
    def name(self) -> str:
        order = f"swapped order {self.seed}" if self.seed else "the formulas' order"
        return f"{order}, results handed on" if self.handed else order


ORDERS = (Order(0, False), Order(1, False), Order(0, True), Order(1, True))


def swapped_neighbours(events: list, seed: int) -> list:
    """`events` with each pair of neighbouring allocations (neither a probe) swapped with
    probability 1/2, drawn from `random.Random(seed)`; a swapped pair is not swapped again
    with the event after it."""
    rng = random.Random(seed)
    out = list(events)
    i = 0
    while i < len(out) - 1:
        (k1, n1), (k2, n2) = out[i], out[i + 1]
        if n1 is not None and n2 is not None and k1 is not PROBE and k2 is not PROBE and rng.random() < 0.5:
            out[i], out[i + 1] = out[i + 1], out[i]
            i += 2
        else:
            i += 1
    return out


def handed_on(events: list) -> list:
    """`events` with each layer's result (an `output` allocation of a formula's order, key kind
    "output") kept for its reader: where the first saved tensor allocated after the result is
    freed (key kind "tensor", not live) has its size in blocks, that tensor takes the result's
    block (the result's allocation renamed, its free and the tensor's allocation left out);
    otherwise the events stay as they are."""
    out = list(events)
    live: set = set()
    made: dict = {}  # a live result's key -> the index of its allocation
    waiting = None  # (index of the allocation, index of the free) of the result freed last
    drop = set()
    for i, (key, nbytes) in enumerate(out):
        if nbytes is None:
            if key in made and key in live:
                waiting = (made.pop(key), i)
            live.discard(key)
            continue
        if key is PROBE or key in live:
            continue
        kind = key[0] if isinstance(key, tuple) else None
        if waiting is not None and kind == "tensor":
            at, freed = waiting
            waiting = None
            if round_up(out[at][1], ALLOCATOR_GRANULE) == round_up(nbytes, ALLOCATOR_GRANULE):
                out[at] = (key, out[at][1])
                drop.update((freed, i))
                live.add(key)
                continue
        if kind == "output":
            waiting = None
            made[key] = i
        live.add(key)
    return [e for i, e in enumerate(out) if i not in drop]
