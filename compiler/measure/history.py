"""A GPU step's own allocation history, and its replay through the caching allocator model.

Contract: `events(snapshot, index)` reads the trace of `torch.cuda.memory._snapshot()` (what
`_record_memory_history` kept for device `index`) into `(action, address, size)` tuples in
order, `(action, address, size, where)` for an entry that says where it was made (`where`:
a traced allocation's op, module and step; a GPU's from its entry's frames, when the history
kept them); `write` / `read` keep them as gzip JSON lines beside a record
(`memspec measure --device cuda --memory-history PATH`); `replay(events)` runs every alloc
and completed free through `compiler.memory.allocator.Allocator` and returns a `Replay`: the
model's peak reserved and allocated for the GPU's own sequence beside the GPU's (its segment
allocations and frees summed, and its blocks). Where the two reserved figures differ, the
allocator model is wrong for that sequence; where they agree and the trace's replay does not,
the traced sequence is (the order or sizes of the CPU trace's allocations).

`replay(...).openings` lists the segments a history shows the GPU adding (its own segment
entries), `replay_estimate(...).openings` those an estimate's replay makes the model add, and
`compare` lines the two lists up by their requests' sizes: a segment the GPU opened and the estimate's replay did not
(or the other way) is where the estimate's sequence leaves the GPU's.

Run as `python -m compiler.measure.history FILE...` it prints one line per history
(`memspec validate RECORD --history FILE` compares the record's estimate with it).
"""

from __future__ import annotations

import difflib
import gzip
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..memory.allocator import AllocConfError, Allocator, AllocatorConfig, OutOfMemoryError

# The actions of torch.cuda.memory's trace entries (c10/cuda/CUDACachingAllocator.h,
# TraceEntry::Action): a block handed out, one freed (completed: back in the cache, after any
# stream use), a segment cudaMalloc'd or cudaFree'd by the allocator itself.
ALLOC, FREE_REQUESTED, FREE_COMPLETED = "alloc", "free_requested", "free_completed"
SEGMENT_ALLOC, SEGMENT_FREE = "segment_alloc", "segment_free"
# under expandable_segments:True: pages mapped into (unmapped from) a pool's one segment
SEGMENT_MAP, SEGMENT_UNMAP = "segment_map", "segment_unmap"
# the request that failed after the allocator emptied its cache (`size`: the bytes asked for;
# torch's entry has no `addr` but `device_free`, the bytes CUDA still reported free, kept in
# the address's place: torch/cuda/memory.py, _snapshot's TraceEntry)
OOM = "oom"
KEPT = (ALLOC, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, OOM)


def events(snapshot: dict, index: int = 0) -> list[tuple]:
    """The device's trace as (action, address, size), oldest first, the actions in KEPT; an
    allocation whose entry kept its frames gets where it was made as a fourth item (`where`)."""
    traces = snapshot.get("device_traces") or []
    if index >= len(traces):
        return []
    out: list[tuple] = []
    for e in traces[index]:
        action = e.get("action")
        if action not in KEPT:
            continue
        event = (action, int(e["device_free"] if action == OOM else e["addr"]), int(e["size"]))
        made = where(e.get("frames") or ()) if action == ALLOC else ""
        out.append((*event, made) if made else event)
    return out


def where(frames: Sequence[dict]) -> str:
    """Where a GPU's allocation was made, from its trace entry's frames (innermost first, as
    `_record_memory_history` keeps them: Python's with stacks="python", C++'s among them with
    "all"): the innermost frame that is either an autograd node's apply ("LogSoftmaxBackward0":
    autograd's thread runs no Python) or Python outside torch ("modeling_qwen2.py:289 forward",
    also a checkpointed layer's forward recomputed inside a backward node), else the innermost
    Python frame; "" without frames."""
    python = []
    for f in frames:
        name, filename = str(f.get("name", "")), str(f.get("filename", ""))
        node = _AUTOGRAD_NODE.search(name)
        if node:
            return node.group(1)
        if filename.endswith(".py"):
            if "/torch/" not in filename:
                return _python_frame(f)
            python.append(f)
    return _python_frame(python[0]) if python else ""


def _python_frame(f: dict) -> str:
    return f"{Path(str(f['filename'])).name}:{f.get('line', 0)} {f.get('name', '')}".rstrip()


# a C++ frame of an autograd node's apply: torch::autograd::generated::MulBackward0::apply(...)
_AUTOGRAD_NODE = re.compile(r"(?:^|::)(\w+Backward\d*)::apply")


def write(path: Path, history: Iterable[tuple]) -> None:
    """`history` as gzip JSON lines at `path`, its folder made where missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for event in history:
            f.write(json.dumps(event) + "\n")


def read(path: Path) -> list[tuple]:
    with gzip.open(path, "rt") as f:
        return [tuple(json.loads(line)) for line in f if line.strip()]


@dataclass
class Recording(Allocator):
    """The allocator model keeping what it is asked as a history in the trace's own actions
    (`history`): each allocation its block's address and the bytes asked (as a GPU's entry
    has them: the block may be larger, a remainder the allocator does not split), after the
    segment entry that was made for it, each free completed at once (no streams). What `memspec measure
    --memory-history` writes for a traced step, the tracer's sequence as `read` gives a GPU's,
    so that `memspec validate --history` lines an estimate up with a trace as with a GPU."""

    history: list = field(default_factory=list)
    # what an allocation is, for its history entry (MemoryTracer.describe); "" for none
    describe: Callable[[object], str] | None = None

    def malloc(self, key: object, nbytes: int) -> int:
        before = self.reserved
        size = super().malloc(key, nbytes)
        if self.reserved > before:
            self.history.append((SEGMENT_MAP if self.config.expandable_segments else SEGMENT_ALLOC, 0, self.reserved - before))
        made = self.describe(key) if self.describe is not None else ""
        self.history.append((ALLOC, self._live[key].ptr, nbytes, made) if made else (ALLOC, self._live[key].ptr, nbytes))
        return size

    def free(self, key: object) -> None:
        block = self._live[key]  # NB: a key not live is the KeyError Allocator.free raises
        ptr, size = block.ptr, block.size  # NB: before it merges with its neighbours
        super().free(key)
        self.history.append((FREE_COMPLETED, ptr, size))

    def probe(self, nbytes: int) -> None:
        """An allocation freed at once, recorded as both (`Allocator.probe` leaves no trace)."""
        key = object()
        self.malloc(key, nbytes)
        self.free(key)


@dataclass(frozen=True)
class Replay:
    allocations: int  # allocs replayed
    model_reserved: int  # the allocator model's peak reserved for the GPU's own sequence
    # the model's peak of live blocks: what torch.cuda.max_memory_allocated reads (a block
    # counts whole, with a remainder the allocator does not split off)
    model_allocated: int
    gpu_reserved: int  # the GPU's peak of segment allocations less segment frees
    gpu_allocated: int  # the peak of the live allocations' bytes as asked (what the entries carry)
    unmatched_frees: int  # frees of blocks allocated before the history began
    gpu_out_of_memory: int | None = None  # the request the GPU could not serve, in bytes
    model_out_of_memory: bool | None = None  # with a capacity: whether the model fails it too
    openings: tuple["Opened", ...] = ()  # the segments the GPU added, each with the allocation it was made for, in order

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.model_reserved - self.gpu_reserved) / self.gpu_reserved if self.gpu_reserved else 0.0


def replay(history: Iterable[tuple], config: AllocatorConfig | None = None, capacity: int | None = None, device_memory: int | None = None) -> Replay:
    """NB: a block is keyed by its address, which the GPU reuses once it is freed: each alloc
    replaces the key's previous (freed) block. Sizes are the bytes asked (a GPU's entries carry
    the request: 4 B, 768 B; the model rounds them as the allocator does).
    `capacity`: the bytes the allocator could reserve on that device (its memory less the
    context), where a step came near it: the model then empties its cache and retries, as
    the GPU did (its `segment_free`s). `device_memory`: the GPU's memory as CUDA reports it
    (torch.cuda.get_device_properties().total_memory), which sizes an expandable segment."""
    model = Allocator(config or AllocatorConfig(), capacity, device_memory)
    live: dict[int, int] = {}
    reserved = peak_reserved = allocated = peak_allocated = 0
    allocs = unmatched = pending = 0
    gpu_oom = model_oom = None
    openings: list[Opened] = []
    for action, addr, size, *made in history:
        if action == OOM:
            gpu_oom = size
            if capacity is not None:
                try:
                    model.probe(size)
                    model_oom = False
                except OutOfMemoryError:
                    model_oom = True
            continue
        if action == ALLOC:
            allocs += 1
            if pending:
                # NB: the trace's segment entries come before the allocation they were made for
                openings.append(Opened(allocs, size, pending, allocated, reserved, made[0] if made else "", largest_free=model.largest_free(size)))
                pending = 0
            model.malloc(addr, size)
            live[addr] = size
            allocated += size
            peak_allocated = max(peak_allocated, allocated)
        elif action == FREE_COMPLETED:
            if addr in live:
                model.free(addr)
                allocated -= live.pop(addr)
            else:
                unmatched += 1
        elif action in (SEGMENT_ALLOC, SEGMENT_MAP):
            reserved += size
            pending += size
            peak_reserved = max(peak_reserved, reserved)
        elif action in (SEGMENT_FREE, SEGMENT_UNMAP):
            reserved -= size
    return Replay(allocs, model.peak_reserved, model.peak_allocated, peak_reserved, peak_allocated, unmatched, gpu_oom, model_oom, tuple(openings))


@dataclass(frozen=True)
class Opened:
    """A request the allocator served by reserving more: a new segment (under expandable
    segments, more pages of the pool's one)."""

    at: int  # the request's number among the sequence's allocations, from 1
    request: int  # the bytes asked for
    grew: int  # the bytes reserved for it
    allocated: int  # the bytes allocated before it
    reserved: int  # the bytes reserved after it
    name: str = ""  # what the estimate calls the allocation; a history's `where`, "" where it kept none
    step: int = 0  # the estimate's training step, from 1 (0: before the first, or a history's)
    largest_free: int = 0  # the largest cached free block of the request's pool before it (Allocator.largest_free)


@dataclass(frozen=True)
class EstimateReplay:
    openings: list[Opened]  # the segments the estimate's replay makes the model reserve
    step_reserved: list[int]  # what it reserves at most in each training step


def replay_estimate(
    events: Sequence, probe_key: object, config: AllocatorConfig, device_memory: int | None = None, step_starts: Sequence[int] = ()
) -> EstimateReplay:
    """An estimate's replay (replay.recording_replays), each event played as the replay plays
    it (`Allocator.play`), one at a time: the segments it makes the model reserve, and what it
    reserves at most in each training step (`step_starts`: the event each step begins with), as
    max_memory_reserved reset at the step's start reads it: the segments kept from before count
    too."""
    model = Allocator(config, device_memory=device_memory)
    out: list[Opened] = []
    peaks: list[int] = []
    step = 0
    starts = list(step_starts)

    def begin_steps(upto: int) -> None:
        nonlocal step
        while step < len(starts) and starts[step] <= upto:
            if step:
                peaks.append(model.peak_reserved)
            model.peak_reserved = model.reserved
            step += 1

    for i, (key, nbytes) in enumerate(events):
        begin_steps(i)
        allocated, reserved = model.allocated, model.reserved
        largest = model.largest_free(nbytes) if nbytes is not None else 0
        model.play(((key, nbytes),), [], probe_key)
        if model.reserved > reserved:  # NB: only an allocation grows it; mallocs counts it
            name = "an allocation freed at once" if key is probe_key else " ".join(str(k) for k in key) if isinstance(key, tuple) else str(key)
            out.append(Opened(model.mallocs, nbytes, model.reserved - reserved, allocated, model.reserved, name, step, largest))
    begin_steps(len(events))  # NB: a step that begins where the events end
    if step:
        peaks.append(model.peak_reserved)
    return EstimateReplay(out, peaks)


def compare(gpu: Sequence[Opened], estimate: Sequence[Opened], min_bytes: int = 0) -> list[tuple[Opened | None, Opened | None]]:
    """The two lists' openings of `min_bytes` or more, lined up by their requests' sizes (to the
    MiB: under expandable segments the pages mapped for one request depend on the free end
    before it): pairs `(gpu, estimate)`, None on the side that opened nothing there."""
    mib = 1 << 20
    g = [o for o in gpu if o.grew >= min_bytes]
    e = [o for o in estimate if o.grew >= min_bytes]
    pairs: list[tuple[Opened | None, Opened | None]] = []
    matcher = difflib.SequenceMatcher(None, [round(o.request / mib) for o in g], [round(o.request / mib) for o in e], autojunk=False)
    for tag, g1, g2, e1, e2 in matcher.get_opcodes():
        if tag == "equal":
            pairs.extend(zip(g[g1:g2], e[e1:e2]))
        else:
            pairs.extend((o, None) for o in g[g1:g2])
            pairs.extend((None, o) for o in e[e1:e2])
    return pairs


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m compiler.measure.history", description="replay GPU allocator histories through the model")
    parser.add_argument("paths", nargs="+", metavar="HISTORY.jsonl.gz")
    parser.add_argument(
        "--capacity",
        type=int,
        metavar="BYTES",
        help="what the allocator could reserve on that GPU (its memory less the CUDA context): the model empties its cache "
        "near it, and a request the GPU could not serve is asked of it too",
    )
    parser.add_argument(
        "--device-memory",
        type=int,
        dest="device_memory",
        metavar="BYTES",
        help="the GPU's memory as CUDA reports it (torch.cuda.get_device_properties(0).total_memory): an expandable segment's address space is 1 1/8 of it",
    )
    parser.add_argument(
        "--alloc-conf",
        dest="alloc_conf",
        default="",
        metavar="CONF",
        help="the PYTORCH_CUDA_ALLOC_CONF the steps ran under (the record's experiment alloc_conf), e.g. expandable_segments:True",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = AllocatorConfig.parse(args.alloc_conf)
    except AllocConfError as exc:
        print(f"--alloc-conf: {exc}", file=sys.stderr)
        return 1
    paths = [Path(p) for p in args.paths]
    gib = 2**30
    for path in paths:
        r = replay(read(path), config, capacity=args.capacity, device_memory=args.device_memory)
        print(
            f"{path.name}: {r.allocations} allocations; GPU reserved {r.gpu_reserved / gib:.2f} GiB, "
            f"allocations of {r.gpu_allocated / gib:.2f} GiB at most as asked; the allocator model on the same sequence "
            f"{r.model_reserved / gib:.2f} GiB reserved ({r.error_pct:+.2f} %), {r.model_allocated / gib:.2f} GiB allocated "
            "(its blocks, as max_memory_allocated counts them)"
            + (f"; {r.unmatched_frees} frees of blocks from before the history" if r.unmatched_frees else "")
            + (f"; the GPU ran out of memory asking for {r.gpu_out_of_memory:,} B" if r.gpu_out_of_memory is not None else "")
            + ({True: " (the model too)", False: " (the model would serve it)"}.get(r.model_out_of_memory, ""))
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
