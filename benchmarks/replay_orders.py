"""Benchmark companion (not a test): an estimate's reserved over how many orders of its step,
against measured records.

The replay runs the step's allocations in the order the formulas give and in more
(`compiler/pipeline/orders.py`): orders where every two allocations made back to back swap
places with probability 1/2 (seeded), each with and without a layer's result handed on to
its reader; reserved is the largest. This script estimates each record with the formulas'
order alone and with N swapped orders beside it, each with and without the hand-on (the
estimate's: N = 1), and prints the reserved error of both: what more orders would buy, and cost.

    python benchmarks/replay_orders.py tests/measured/gpu --orders 4
    python benchmarks/replay_orders.py tests/measured/gpu --orders 1 --only qwen3-vl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def reserved_over_orders(path: Path, record: dict, orders: int) -> tuple[int, int] | None:
    """The estimate's reserved replayed in its own order alone, and as the largest over it and
    `orders` swapped ones, each with and without results handed on (replay.ORDERS set for
    the call); None when the record has no estimate."""
    from compiler.commands.validation import record_report
    from compiler.pipeline import replay
    from compiler.pipeline.orders import Order

    kept = replay.ORDERS
    try:
        figures = []
        for n in (0, orders):
            replay.ORDERS = kept[:1] if n == 0 else tuple(Order(seed, handed) for handed in (False, True) for seed in range(n + 1))
            report, _ = record_report(path, record)
            if report is None:
                return None
            figures.append(report.reserved)
    finally:
        replay.ORDERS = kept
    return figures[0], figures[1]


def main(argv: list[str] | None = None) -> int:
    from compiler.commands.validation import record_files

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument(
        "--orders",
        type=int,
        default=4,
        help="swapped orders beside the formulas' own, each with and without results handed on (default 4; the estimate's is 1)",
    )
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
        base, most_bytes = found
        own, most = 100 * (base - measured) / measured, 100 * (most_bytes - measured) / measured
        rows.append((record["name"], own, most))
        print(f"{record['name'][:72]:72s} {own:+7.2f} % {most:+7.2f} %  ({most_bytes - base:+,} B)", flush=True)
    for label, i in (("the formulas' order alone", 1), (f"largest of {2 * (args.orders + 1)} orders", 2)):
        errors = [row[i] for row in rows]
        if errors:
            print(
                f"{label:34s} n={len(errors)}  MAPE {sum(map(abs, errors)) / len(errors):.2f} %  "
                f"under by more than 2 %: {sum(e < -2 for e in errors)}  worst {min(errors):+.2f} %"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
