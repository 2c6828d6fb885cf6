"""Independent pieces of a long command spread over forked processes.

Contract: `ordered(fn, items)` yields `fn(item)` for every item, in the items' order: in
forked processes, one per CPU this process may use, when there are at least `PER_PROCESS`
items for each, else here. `fn` is a module-level function and the items and answers pickle;
the processes start with what this one has loaded (formula libraries, checked specs), and
each piece must depend on nothing another piece does, so that the answers are the same
either way. Without `fork` (Windows) everything runs here.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Sequence

# Items per process before a second process is worth its start.
PER_PROCESS = 8


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def ordered(fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Any]:
    import multiprocessing

    workers = min(cpus(), len(items) // PER_PROCESS)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield from map(fn, items)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(fn, items, chunksize=2)
