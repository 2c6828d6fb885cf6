"""Benchmark companion (not a test): how far an estimate's reserved moves when allocations made
back to back swap places, against measured records.

The estimate's replay runs its step's allocations in the order its formulas give. Where two
allocations follow each other with no free between them (a layer's outputs, a backward's
weight gradients), the GPU's order is often the formula's only by choice, and the caching
allocator's best fit can place the second block elsewhere when the first comes second. Such
a swap leaves every allocated figure as it was (the pair's bytes are live together either
way) and moves only the layout. This script replays each record's estimate in its own order
and in N orders where each such pair swaps with probability 1/2 (seeded: the same orders on
every run), and prints the reserved error of the estimate's order beside that of the largest
of the N + 1 replays.

    python benchmarks/replay_orders.py tests/measured/gpu ../shared/gpu-records
    python benchmarks/replay_orders.py tests/measured/gpu --orders 8 --only qwen3-vl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def swapped(events: list, seed: int, probe: object) -> list:
    """`events` with each pair of neighbouring allocations (neither a probe) swapped with
    probability 1/2; a swapped pair is not swapped again with the next event."""
    rng = random.Random(seed)
    out = list(events)
    i = 0
    while i < len(out) - 1:
        (k1, n1), (k2, n2) = out[i], out[i + 1]
        if n1 is not None and n2 is not None and k1 is not probe and k2 is not probe and rng.random() < 0.5:
            out[i], out[i + 1] = out[i + 1], out[i]
            i += 2
        else:
            i += 1
    return out


def peak(replay, events: list, probe: object) -> int:
    from compiler.memory.allocator import Allocator

    allocator = Allocator(replay.alloc_conf, device_memory=replay.device_memory)
    allocator.play(events, [], probe_key=probe)
    return allocator.peak_reserved


def reserved_over_orders(path: Path, record: dict, orders: int) -> tuple[int, list[int]] | None:
    """The estimate's reserved in its own order, and in each of `orders` swapped ones; None when
    the record has no estimate."""
    from compiler.commands.validation import record_report
    from compiler.pipeline.simulate import PROBE, recording_replays

    with recording_replays() as replays:
        report, _ = record_report(path, record)
    if report is None or not replays:
        return None
    base = max(peak(r, r.events, PROBE) for r in replays)
    if base != report.reserved:  # NB: not the replay reserved comes from (a device_map split, say)
        return None
    return base, [max(peak(r, swapped(r.events, seed, PROBE), PROBE) for r in replays) for seed in range(1, orders + 1)]


def main(argv: list[str] | None = None) -> int:
    from compiler.commands.validation import record_files

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--orders", type=int, default=8, help="swapped orders per record (default 8)")
    parser.add_argument("--only", default="", help="records whose name contains this")
    args = parser.parse_args(argv)
    rows = []
    for path in record_files(args.paths):
        record = json.loads(path.read_text())
        measured = record.get("reserved")
        if not measured or "out_of_memory" in record or args.only not in record.get("name", path.stem):
            continue
        found = reserved_over_orders(path, record, args.orders)
        if found is None:
            continue
        base, swaps = found
        own, most = 100 * (base - measured) / measured, 100 * (max([base, *swaps]) - measured) / measured
        rows.append((record["name"], own, most))
        print(
            f"{record['name'][:72]:72s} {own:+7.2f} % {most:+7.2f} %  ({min(swaps, default=base) - base:+,} .. {max(swaps, default=base) - base:+,} B)",
            flush=True,
        )
    for label, i in (("the estimate's order", 1), (f"largest of it and {args.orders} swapped", 2)):
        errors = [row[i] for row in rows]
        if errors:
            print(
                f"{label:34s} n={len(errors)}  MAPE {sum(map(abs, errors)) / len(errors):.2f} %  "
                f"under by more than 2 %: {sum(e < -2 for e in errors)}  worst {min(errors):+.2f} %"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
