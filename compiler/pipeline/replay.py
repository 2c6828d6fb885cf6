"""The caching allocator replay of an estimate's step (stage 7's reserved figure).

Contract: `replay(setup, state, ...)` runs what the simulated step allocates and frees
(simulate's walk: `state.events`) through compiler.memory.allocator's model of PyTorch's
caching allocator, over REPLAYED_STEPS training steps, in each of orders.ORDERS, and gives
the largest reserved, the allocation that fails on the setup's GPU if one does, and the
allocated peaks of steps 1 and 2. `recording_replays` collects what each replay was given
(compiler.measure.history compares it with a GPU's own history). The last REMEMBERED
answers are kept by their inputs: the same replay asked again is answered from them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import pickle
from dataclasses import dataclass

from ..memory import allocator
from ..memory.allocator import Allocator, OutOfMemory, OutOfMemoryError, allocation_size, round_size
from .orders import ORDERS, Order, handed_on, swapped_neighbours
from .resolve import Setup, gpu_catalog
from .walks.timeline import PROBE, State


@dataclass
class RecordedReplay:
    """An estimate's replay as the allocator was given it: its settings, the device memory that
    sizes an expandable segment, the events in order (`(key, nbytes)` an allocation, `(key,
    None)` a free, `(PROBE, nbytes)` an allocation freed at once, as `Allocator.play` takes
    them), where each training step's begin (indices into `events`), the order it ran in
    (`order`: an index into orders.ORDERS, 0 the formulas') and the peak it reserved (set as
    the replay ends; 0 where it ran out of memory)."""

    alloc_conf: allocator.AllocatorConfig
    device_memory: int | None
    events: list
    step_starts: list
    order: int = 0
    reserved: int = 0


# Set by `recording_replays`: the replays run meanwhile
_recorded: list | None = None


@contextlib.contextmanager
def recording_replays():
    """Collect what every caching-allocator replay the estimates inside the block run is given:
    a `RecordedReplay` for each order the replay on a device without a limit runs in (the ones
    `reserved` comes from: the formulas' order, then each swapped one); what
    compiler.measure.history compares with a GPU's own history."""
    global _recorded
    outer, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = outer


# The training steps the replay runs, as many as every measurement does (`memspec measure`'s
# default --steps, the GPU records' three): the allocator's cache can still open a segment in
# the third (Aya Vision 8B projector-only on an H100: its step 3 reserved 3.61 % more than
# steps 1 and 2, tests/measured/gpu), and no record measures a fourth.
REPLAYED_STEPS = 3
_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
# how the estimate's text, JSON and HTML say where its reserved figure comes from
REPLAY_ACCOUNT = f"the caching allocator replayed over {_WORDS[REPLAYED_STEPS]} steps, the largest of {_WORDS[len(ORDERS)]} orders"


# The last replays an estimate ran, by everything they read (`_inputs`): a search that
# estimates one step twice (fit's levers and its answers under other margins, a data-parallel
# degree that changes no allocation) replays it once. Kept per process, the newest REMEMBERED.
REMEMBERED = 256
_remembered: collections.OrderedDict = collections.OrderedDict()


def _inputs(setup: Setup, state: State, rest: tuple) -> bytes:
    """What a replay's answer depends on, digested: the orders and steps it runs, the
    allocator's settings and limits, the GEMM threads' workspaces `_loaded` places, the step's
    events and the arguments after them. NB: a digest of their pickle, not the events
    themselves, which a remembered answer would keep alive (megabytes each)."""
    target = setup.target
    inputs = (ORDERS, REPLAYED_STEPS, setup.alloc_conf, _limits(setup), target.gemm_threads, target.workspace_allocations, state.events, rest)
    return hashlib.blake2b(pickle.dumps(inputs, pickle.HIGHEST_PROTOCOL), digest_size=32).digest()


def _remembering(replay):
    """`replay`, answering from `_remembered` where the same inputs were replayed before (not
    while `recording_replays` collects every replay, nor with REMEMBERED 0: none looked up,
    none kept)."""

    @functools.wraps(replay)
    def remembered(setup: Setup, state: State, *rest):
        if _recorded is not None or not REMEMBERED:
            return replay(setup, state, *rest)
        key = _inputs(setup, state, rest)
        answer = _remembered.get(key)
        if answer is None:
            answer = _remembered[key] = replay(setup, state, *rest)
            if len(_remembered) > REMEMBERED:
                _remembered.popitem(last=False)
        else:
            _remembered.move_to_end(key)
        return answer

    return remembered


@_remembering
def replay(
    setup: Setup,
    state: State,
    resident: list[int],
    states: list[int],
    walk_start: int,
    step_start: int,
    first_step: list | None = None,
    untied: int = 0,
    verdict_only: bool = False,
) -> tuple[int, OutOfMemory | None, bool, tuple[int, int]]:
    """The caching allocator's reserved bytes over REPLAYED_STEPS training steps, the allocation that
    fails on `setup.gpu` if one does, whether the bytes are a lower bound (`verdict_only`:
    a replay past the GPU is not run again within it), and its allocated peaks of step 1 and
    step 2 (max_memory_allocated of each, reset as a step begins: block sizes).

    The replay runs what a job allocates in its order: the weights and buffers, with tied
    embeddings the output embedding's own weight made and dropped (`untied` bytes, see
    `_untied_head`), the allocations made before the walk (ZeRO-3's gradient partition,
    DeepSpeed's staging buffers), then step 1 (the walk's forward and backward, then its
    step(): `first_step`, the placing walk's order of the masters, the master gradients, the
    states and the temporaries where it knows them, else the states then the steady step's
    allocations) and steps 2 and 3 (the same with the states in place); whatever a step made
    and still holds goes at its end (zero_grad(set_to_none=True)), except each GEMM thread's
    cuBLAS and cuBLASLt workspaces, which the walk makes at the thread's first GEMM and the
    allocator keeps for good. Step 1's pattern of frees leaves cached blocks that step 2 is
    served from, and step 2's those of step 3, which is why more than one step is replayed.
    NB: a formula's transient is one allocation (the running layer's, beside the rest of its
    module's stack) unless the formula gives its order (`allocations:`), so fragmentation is
    modelled at that grain.
    """
    capacity, memory = _limits(setup)
    walk, step = state.events[walk_start:step_start], state.events[step_start:]
    loaded = _loaded(setup, state.events[:walk_start], walk, resident, untied)
    made_states = [(("state", i), size) for i, size in enumerate(states) if size]
    loaded, made_states, walk_n, step_n, first_step = map((keys := _Keys()).numbered, (loaded, made_states, walk, step, first_step))

    # NB: the walk and the step with their results handed on, made once for the orders that hand them
    handed = functools.cache(lambda: (keys.numbered(handed_on(walk)), keys.numbered(handed_on(step))))

    def run(allocator: Allocator, recorded: RecordedReplay | None = None, order: int = 0) -> tuple[int, tuple[int, int]]:
        lists = handed() if ORDERS[order].handed else (walk_n, step_n)
        return _run_steps(allocator, keys, loaded, *lists, first_step, made_states, recorded, ORDERS[order])

    def recording(order: int) -> RecordedReplay | None:
        if _recorded is None:
            return None
        _recorded.append(RecordedReplay(setup.alloc_conf, memory, [], [], order))
        return _recorded[-1]

    try:
        peak, peaks = run(Allocator(setup.alloc_conf, device_memory=memory), recording(0))
    except OutOfMemoryError as error:
        # NB: without a limit, only a request no expandable segment's address space holds (more
        # than the device's memory) fails: the step cannot run on this GPU
        return _failed_at(error.oom, setup.alloc_conf), keys.named_oom(error.oom), False, (0, 0)
    # NB: the largest over the orders (orders.ORDERS; the allocated peaks are the formulas'
    # order's); a verdict's replay stops at the first past the GPU
    for order in range(1, len(ORDERS)):
        if verdict_only and capacity is not None and peak > capacity:
            break
        try:
            peak = max(peak, run(Allocator(setup.alloc_conf, device_memory=memory), recording(order), order)[0])
        except OutOfMemoryError as error:
            peak = max(peak, _failed_at(error.oom, setup.alloc_conf))
    # NB: the figure is the replay on a device without a limit. Where it passes the GPU's
    # memory, the replay runs again within it, as the allocator does (a failed cudaMalloc
    # frees the wholly free cached segments and retries), for the allocation that fails; a
    # step that gets through only by that release is not counted on to fit: the replay's
    # blocks are coarser than the step's tensors, so more of its segments are wholly free
    # (measured: LLaVA-1.5-7B pretrain at micro-batch 38 ran out of memory on an H100).
    if capacity is None or peak <= capacity:
        return peak, None, False, peaks
    if verdict_only:
        return peak, None, True, peaks
    try:
        run(Allocator(setup.alloc_conf, capacity, memory))
        return peak, None, False, peaks
    except OutOfMemoryError as error:
        return max(peak, _failed_at(error.oom, setup.alloc_conf)), keys.named_oom(error.oom), False, peaks


def _failed_at(oom: OutOfMemory, alloc_conf: allocator.AllocatorConfig) -> int:
    """What the allocator holds once the failed request's segment is counted."""
    return oom.reserved + allocation_size(round_size(oom.requested, alloc_conf))


class _Keys:
    """The events' keys numbered for the allocator: an int hashes where a key's tuple hashes
    element by element, and a replay looks each key up three times a step (the allocation,
    the check that it is not live, the free). PROBE stays itself."""

    def __init__(self) -> None:
        self.number: dict = {}
        self.names: list = []
        self.workspaces: set[int] = set()  # the numbers of the GEMM threads' workspaces (key kind "workspace")

    def numbered(self, events: list | None) -> list | None:
        if events is None:
            return None
        number, names = self.number, self.names
        out = []
        for key, nbytes in events:
            if key is not PROBE:
                n = number.get(key)
                if n is None:
                    n = number[key] = len(names)
                    names.append(key)
                    if key[0] == "workspace":
                        self.workspaces.add(n)
                key = n
            out.append((key, nbytes))
        return out

    def named(self, events) -> list:
        """`events` with the keys this numbering made named again (a key it did not number, a
        probe's or another replay's, stays as it is)."""
        names = self.names
        return [(names[key] if type(key) is int else key, nbytes) for key, nbytes in events]

    def named_oom(self, oom: OutOfMemory) -> OutOfMemory:
        """`oom` naming its allocation's key (a probe's is the allocator's own)."""
        return dataclasses.replace(oom, key=self.names[oom.key]) if isinstance(oom.key, int) else oom


def _run_steps(
    allocator: Allocator,
    keys: _Keys,
    loaded: list,
    walk: list,
    step: list,
    first_step: list | None,
    made_states: list,
    recorded: RecordedReplay | None = None,
    order: Order = ORDERS[0],
) -> tuple[int, tuple[int, int]]:
    """replay's steps on `allocator`: its peak reserved, and the max_memory_allocated of steps
    1 and 2 (each reset as its step begins). `recorded` (recording_replays) gets its events.
    `order.seed` > 0: each list in that swapped order (orders.swapped_neighbours), every step
    alike; the walk and the step come with their results handed on where `order` hands them."""
    if order.seed:
        loaded, walk, step = (swapped_neighbours(events, order.seed) for events in (loaded, walk, step))
        first_step = None if first_step is None else swapped_neighbours(first_step, order.seed)
    log = None if recorded is None else recorded.events
    live = allocator.live
    workspaces = keys.workspaces

    # NB: an allocation still live from the step before (a buffer DeepSpeed keeps) is kept,
    # not made again; `made` collects what this step allocated
    def play(events: list, made: list) -> None:
        if log is not None:
            log.extend(keys.named(events))
        allocator.play(events, made, probe_key=PROBE)

    play(loaded, [])
    steps = []
    before = None
    for number in range(1, REPLAYED_STEPS + 1):
        if number > 1:
            # NB: a step that begins from the cache the step before began from replays it
            # exactly: nothing more to learn (most steps settle by the second)
            layout = allocator.layout()
            if layout is not None and layout == before:
                break
            before = layout
        allocator.peak_allocated = allocator.allocated
        if recorded is not None:
            recorded.step_starts.append(len(recorded.events))
        made: list = []
        play(walk, made)
        if number == 1 and first_step is not None:
            play(first_step, [])  # NB: the states it makes stay
        else:
            if number == 1:
                play(made_states, [])
            play(step, made)
        # NB: the workspaces stay cached
        play([(key, None) for key in made if key in live and key not in workspaces], [])
        steps.append(allocator.peak_allocated)
    if recorded is not None:
        recorded.reserved = allocator.peak_reserved
    return allocator.peak_reserved, (steps[0], steps[1])


def _limits(setup: Setup) -> tuple[int | None, int | None]:
    """The replay's allocator limits on `setup.gpu`: what the card leaves the allocator (its
    memory less the CUDA context) and the device memory that sizes expandable segments.
    NB: the catalog's memory is nvidia-smi's; CUDA's totalGlobalMem, which sizes an expandable
    segment's address space (1 1/8 of it), is a few hundred MiB less (an H200: 618 MiB, its
    idle NVML figure), which moves only a best fit near the space's end."""
    if setup.gpu is None:
        return None, None
    return setup.gpu.memory - device_overhead(setup), setup.gpu.memory


def _loaded(setup: Setup, before_walk: list, walk: list, resident: list[int], untied: int) -> list:
    """What the replay allocates before step 1 walks: the weights and buffers, the untied
    output embedding made and dropped, the GEMM threads' workspaces that the walk does not
    place, then the walk's own allocations made before it (`before_walk`)."""
    placed = {e[0] for e in walk if e[0][0] == "workspace"}
    loaded = [(("weight", i), size) for i, size in enumerate(resident) if size]
    if untied:
        loaded += [(("untied output embedding",), untied), (("untied output embedding",), None)]
    # NB: a thread whose first GEMM the walk does not place (no layer marked gemm) has its
    # workspaces from the start, as before any layer runs
    threads = range(setup.target.gemm_threads)
    loaded += [(("workspace", t, i), b) for t in threads for i, b in enumerate(setup.target.workspace_allocations) if ("workspace", t, i) not in placed]
    return loaded + before_walk


def device_overhead(setup: Setup) -> int:
    """What the device holds beside the allocator's segments: the CUDA context, and NCCL's
    buffers when data-parallel (specs/gpus.yaml)."""
    consts = gpu_catalog()[1]
    return consts.cuda_context + (consts.nccl_per_communicator if setup.dp > 1 else 0)
