"""Count the bytes a training step holds on the device, op by op, without a device.

Contract: `MemoryTracer` is a `TorchDispatchMode`. Every tensor an op returns whose storage is
new gets a `weakref.finalize` on that storage, so the tracer knows exactly which storages are
alive after every op. Each storage is charged its byte size rounded up to the CUDA caching
allocator's block granularity; the running total after each op, plus any kernel scratch the
caller says that op allocates internally, is a candidate for the peak. The tracer works the
same on fake tensors (no memory touched) and on real CPU tensors (used to prove it honest).

Each storage carries a mutable `Allocation` record: its category (parameters, gradients,
activations, ...), the phase and module path that created it, the op, dtype and shape. A peak
keeps references to the records alive at that moment, so relabelling a record later (an
optimizer state is only known to be one when `step()` returns) also corrects the breakdown
of a peak already taken.

`ModuleScope` answers "which module is running": a stack kept by forward pre/post hooks
(which also fire during checkpoint recomputation), and, during backward, the module whose
forward created the autograd node being executed (matched by autograd sequence numbers).

Nothing here knows about models, precisions or CUDA emulation; see `harness` and
`emulation`.
"""

from __future__ import annotations

import bisect
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# c10/core/AllocatorConfig.h (torch 2.13): `kMinBlockSize = 512`, "all sizes are rounded to
# at least 512 bytes"; the CUDA caching allocator rounds every request up to a multiple of it.
CUDA_BLOCK_GRANULARITY = 512

# Categories, in the order reports list them.
PARAMETERS = "parameters"
BUFFERS = "buffers"
INPUTS = "inputs"
GRADIENTS = "gradients"
MASTER_GRADIENTS = "master_gradients"
OPTIMIZER_STATES = "optimizer_states"
ACTIVATIONS = "activations"
RECOMPUTED = "recomputed_activations"
BACKWARD_TEMPORARIES = "backward_temporaries"
OPTIMIZER_TEMPORARIES = "optimizer_temporaries"
OTHER = "other"
CATEGORIES = (
    PARAMETERS,
    BUFFERS,
    INPUTS,
    GRADIENTS,
    MASTER_GRADIENTS,
    OPTIMIZER_STATES,
    ACTIVATIONS,
    RECOMPUTED,
    BACKWARD_TEMPORARIES,
    OPTIMIZER_TEMPORARIES,
    OTHER,
)

# Phases of a training step, in order. "loss" is the part of the model's forward after the
# LM head (the causal-LM loss); "setup" is anything outside a step.
SETUP, FORWARD, LOSS, BACKWARD, OPTIMIZER = "setup", "forward", "loss", "backward", "optimizer"
PHASES = (FORWARD, LOSS, BACKWARD, OPTIMIZER)


# The ops that run cuBLAS: a GPU holds cuBLAS workspaces once it has run one (device_map)
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "_scaled_mm"})


def round_up(nbytes: int, granularity: int) -> int:
    """Bytes the caching allocator hands out for a request of `nbytes` (0 stays 0)."""
    return -(-nbytes // granularity) * granularity


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage is on this device: a DTensor's local shard (FSDP2's sharded
    parameters, their gradients and optimizer states), else the tensor itself. A DTensor is
    a wrapper without storage of its own."""
    inner = getattr(tensor, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else tensor


def default_category(phase: str, recomputing: bool) -> str:
    """What a storage created in `phase` is, until something relabels it."""
    if phase in (FORWARD, LOSS):
        return ACTIVATIONS
    if phase == BACKWARD:
        return RECOMPUTED if recomputing else BACKWARD_TEMPORARIES
    if phase == OPTIMIZER:
        return OPTIMIZER_TEMPORARIES
    return OTHER


@dataclass
class Allocation:
    """One live storage. Mutable on purpose: see the module docstring."""

    nbytes: int
    category: str
    phase: str
    module: str
    op: str
    dtype: str
    shape: tuple[int, ...]
    alive: bool = True


@dataclass
class Peak:
    """The highest point seen in one (step, phase) window."""

    allocated: int = -1
    traced: int = 0
    phase: str = ""
    op: str = ""
    module: str = ""
    records: list[Allocation] = field(default_factory=list)
    scratch: tuple[tuple[str, int], ...] = ()

    def breakdown(self) -> dict[str, int]:
        """Bytes by category at the peak, then each named kernel scratch (`scratch.<name>`)."""
        by_category: Counter[str] = Counter()
        for record in self.records:
            by_category[record.category] += record.nbytes
        out = {c: by_category[c] for c in CATEGORIES if by_category[c]}
        for name, nbytes in self.scratch:
            out[f"scratch.{name}"] = out.get(f"scratch.{name}", 0) + nbytes
        return out


ScratchFn = Callable[[object, tuple, dict, object], Iterable[tuple[str, int]]]


class MemoryTracer(TorchDispatchMode):
    """Live storage bytes per category after every op, and the peak per (step, phase).

    `context()` returns (module path, recomputing) for the op being run; `scratch(func, args,
    kwargs, out)` names bytes a kernel allocates internally for the duration of that op;
    `made_order(func, outputs)` gives an op's outputs in the order its CUDA kernel makes them;
    `persistent` names bytes alive outside any tensor (workspaces), added to every point.
    `host_ops` are ops whose outputs the emulated run keeps on the host, not the device.
    `device` restricts counting to tensors on that device type (None counts all).
    `watch` names module paths whose own highest point per (step, phase) is kept in `watched`.
    `allocator` (a `compiler.memory.allocator.Allocator`) is handed every storage's
    allocation and free in their order, and each kernel scratch for the duration of its op,
    so that it can tell the segments the caching allocator reserves; with devices tracked
    (`track_devices`), each GPU has an allocator of its own with the same settings
    (`allocators`), as each CUDA device has its own caching allocator.
    """

    def __init__(
        self,
        *,
        granularity: int = CUDA_BLOCK_GRANULARITY,
        context: Callable[[], tuple[str, bool]] = lambda: ("", False),
        scratch: ScratchFn | None = None,
        made_order: Callable[[Any, list], list] | None = None,
        host_ops: frozenset = frozenset(),
        device: str | None = None,
        timeline: bool = False,
        watch: frozenset = frozenset(),
        allocator=None,
    ) -> None:
        super().__init__()
        self.granularity = granularity
        self.context = context
        self.scratch = scratch
        self.made_order = made_order
        self.host_ops = host_ops
        self.device = device
        self.keep_timeline = timeline
        self.allocator = allocator
        self.live: dict[int, Allocation] = {}
        # Storages the host ops made: an in-place op on one (a for-loop optimizer's
        # `step_t += 1` on its host step counter) returns it, and it stays on the host.
        self.host: set[int] = set()
        self.total = 0
        self.by_category: Counter[str] = Counter()
        self.persistent: dict[str, int] = {}
        self.phase = SETUP
        self.step = 0
        self.peaks: dict[tuple[int, str], Peak] = {}
        self.timeline: list[dict] = []
        # The highest point while each watched module's ops ran, per (step, phase): the
        # moment of one layer, which a phase's own peak need not be
        self.watch = watch
        self.watched: dict[tuple[int, str], dict[str, int]] = {}
        # A model split across GPUs (device_map): each storage's GPU and the highest point of
        # each GPU per step; off (None) unless `track_devices` is called
        self.device_of: dict[int, int] | None = None
        self.by_device: Counter[int] = Counter()
        self.device_peaks: dict[int, dict[int, int]] = {}
        self.force_device: int | None = None
        self.gemm_devices: set[int] = set()
        self.allocators: dict[int, Any] | None = None
        # the cuBLAS workspaces: `make(allocator, threads)` and the GEMM threads of the phase
        self.make_workspaces: Callable[[Any, int], None] | None = None
        self.workspace_threads = 0
        # one thread's workspaces, made in the replay when its first GEMM runs:
        # `make_workspace(allocator, thread, cublaslt)` (thread 0 the forward's, 1 autograd's)
        self.make_workspace: Callable[[Any, int, bool], None] | None = None
        self.module_device: Callable[[str], int] = lambda module: 0

    # -- storages -------------------------------------------------------------------------

    def track_devices(self, module_device: Callable[[str], int]) -> None:
        """Attribute every storage to a GPU: a new tensor to the GPU of the op's first input
        whose GPU is known (a foreach op's i-th output to its first list's i-th tensor, as
        torch groups foreach ops by device), `force_device` while it is set (a copy to another
        GPU), else the GPU of the running module (`module_device`); keep each GPU's highest
        point per step in `device_peaks` (its storages, the scratch of its ops, and the
        persistent scratch, which every GPU holds)."""
        self.device_of = {}
        self.module_device = module_device
        if self.allocator is not None:
            self.allocators = {}

    def allocator_of(self, gpu: int | None):
        """The caching allocator of `gpu` (made on first use), or the one allocator."""
        if self.allocators is None or gpu is None:
            return self.allocator
        allocator = self.allocators.get(gpu)
        if allocator is None:
            allocator = self.allocators[gpu] = type(self.allocator)(config=self.allocator.config)
            if hasattr(allocator, "describe"):
                allocator.describe = self.allocator.describe
        return allocator

    def describe(self, key) -> str:
        """What the allocator's allocation `key` is, for an allocator history: the op that made
        the storage, what it holds, the module it ran in, the step and phase
        ("_log_softmax.default (activations) in language.loss, step 2 loss"); an allocation of
        the emulation's by its key's parts (a kernel's scratch, a cuBLAS workspace, the untied
        output embedding)."""
        record = self.live.get(key)
        if record is None:
            return " ".join(str(k) for k in key) if isinstance(key, tuple) else ""
        return f"{record.op} ({record.category}) in {record.module or 'the model'}, step {self.step} {record.phase}"

    def workspaces(self, make: Callable[[Any, int], None], threads: int) -> None:
        """The cuBLAS workspaces of `threads` GEMM threads, made by `make(allocator, threads)`:
        on the one allocator, or with devices tracked on each GPU that has run a GEMM (a GPU's
        first GEMM makes its own)."""
        self.make_workspaces, self.workspace_threads = make, threads
        if self.make_workspace is not None:
            return  # NB: made at each thread's first GEMM (`_workspace`)
        if self.allocators is None:
            make(self.allocator, threads)
        else:
            for gpu in sorted(self.gemm_devices):
                make(self.allocator_of(gpu), threads)

    @property
    def peak_reserved(self) -> int | None:
        """The allocator's highest reserved bytes; with devices tracked, the largest GPU's."""
        if self.allocators is not None:
            return max((a.peak_reserved for a in self.allocators.values()), default=0)
        return None if self.allocator is None else self.allocator.peak_reserved

    def gpu_of(self, tensor: torch.Tensor) -> int | None:
        if self.device_of is None:
            return None
        return self.device_of.get(local_tensor(tensor).untyped_storage()._cdata)

    def _output_devices(self, func, args, kwargs, outs: list, module: str) -> list[int]:
        if self.force_device is not None:
            return [self.force_device] * len(outs)
        if func.__name__.startswith("_foreach") and args and isinstance(args[0], (list, tuple)):
            firsts = [self.gpu_of(t) if isinstance(t, torch.Tensor) else None for t in args[0]]
            fallback = next((d for d in firsts if d is not None), self.module_device(module))
            return [firsts[i] if i < len(firsts) and firsts[i] is not None else fallback for i in range(len(outs))]
        known = next((d for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) for d in (self.gpu_of(t),) if d is not None), None)
        return [known if known is not None else self.module_device(module)] * len(outs)

    def _track(self, tensor: torch.Tensor, category: str, module: str, op: str, device: int | None = None) -> Allocation | None:
        tensor = local_tensor(tensor)
        if self.device is not None and tensor.device.type != self.device:
            return None
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.host:
            return None
        record = self.live.get(key)
        if record is not None:
            return record
        record = Allocation(
            nbytes=round_up(storage.nbytes(), self.granularity),
            category=category,
            phase=self.phase,
            module=module,
            op=op,
            dtype=str(tensor.dtype).removeprefix("torch."),
            shape=tuple(tensor.shape),
        )
        self.live[key] = record
        gpu = None
        if self.device_of is not None:
            gpu = device if device is not None else self.module_device(module)
            self.device_of[key] = gpu
            self.by_device[gpu] += record.nbytes
        if self.allocator is not None and storage.nbytes():
            self.allocator_of(gpu).malloc(key, storage.nbytes())
        self.total += record.nbytes
        self.by_category[category] += record.nbytes
        weakref.finalize(storage, self._free, key)
        return record

    def _host(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self.host:
            self.host.add(key)
            weakref.finalize(storage, self.host.discard, key)

    def _free(self, key: int) -> None:
        record = self.live.pop(key, None)
        if record is None:
            return
        record.alive = False
        gpu = None
        if self.device_of is not None and key in self.device_of:
            gpu = self.device_of.pop(key)
            self.by_device[gpu] -= record.nbytes
        allocator = self.allocator_of(gpu)
        if allocator is not None and key in allocator:
            allocator.free(key)
        self.total -= record.nbytes
        self.by_category[record.category] -= record.nbytes

    def resized(self, storage, nbytes: int) -> None:
        """A live storage changed size in place (`UntypedStorage.resize_`: FSDP2 frees and
        re-allocates its unsharded parameters and all-gather outputs this way). The old
        record dies and a new one of the new size takes its place, so that a peak taken
        before keeps the size it saw."""
        record = self.live.get(storage._cdata)
        if record is None:
            return
        nbytes = round_up(nbytes, self.granularity)
        if nbytes == record.nbytes:
            return
        module, _ = self.context()
        record.alive = False
        # NB: the new record before the allocator's malloc, which describes it (`describe`)
        self.live[storage._cdata] = Allocation(
            nbytes=nbytes,
            category=record.category,
            phase=self.phase,
            module=module if nbytes else record.module,
            op="resize_",
            dtype=record.dtype,
            shape=record.shape,
        )
        if self.allocator is not None:
            # NB: resize_ to 0 frees the block; to a new size allocates a new one
            allocator = self.allocator_of(None if self.device_of is None else self.device_of.get(storage._cdata))
            if storage._cdata in allocator:
                allocator.free(storage._cdata)
            if nbytes:
                allocator.malloc(storage._cdata, nbytes)
        self.total += nbytes - record.nbytes
        self.by_category[record.category] += nbytes - record.nbytes
        self._observe("resize_", module, ())

    def __enter__(self):
        # NB: storage resizes are no tensor ops: the dispatcher never shows them to a mode,
        # so the tracer wraps the Python method while it is active.
        original = torch.UntypedStorage.resize_
        tracer = self

        def resize_(storage, nbytes):
            out = original(storage, nbytes)
            tracer.resized(storage, int(nbytes))
            return out

        self._original_resize = original
        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)

    def register(self, tensors: Iterable[torch.Tensor], category: str, module: str = "", device: Callable[[torch.Tensor], int] | None = None) -> None:
        """Count tensors created before tracing began (weights, buffers, the batch); `device`
        gives each one's GPU when devices are tracked."""
        for tensor in tensors:
            self._track(tensor, category, module, "register", device(tensor) if device is not None else None)

    def relabel(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Move the storages of `tensors` to `category` (they keep their history)."""
        for tensor in tensors:
            if tensor is None:
                continue
            record = self.live.get(local_tensor(tensor).untyped_storage()._cdata)
            if record is None or record.category == category:
                continue
            self.by_category[record.category] -= record.nbytes
            self.by_category[category] += record.nbytes
            record.category = category

    # -- dispatch -------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        module, recomputing = self.context()
        if func in self.host_ops:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._host(t)
        else:
            category = default_category(self.phase, recomputing)
            name = func.__name__
            outs = tree_flatten(out)[0]
            if self.made_order is not None:
                outs = self.made_order(func, outs)
            devices = self._output_devices(func, args, kwargs, outs, module) if self.device_of is not None else [None] * len(outs)
            for t, gpu in zip(outs, devices):
                if isinstance(t, torch.Tensor):
                    self._track(t, category, module, name, gpu)
            if self.make_workspace is not None and self.allocator is not None and name.split(".")[0] in GEMM_OPS:
                self._workspace(name, args, devices[0] if outs else None)
        scratch = tuple(self.scratch(func, args, kwargs, out)) if self.scratch else ()
        gpu = None
        if self.device_of is not None:
            gpu = self._observe_devices(func, args, kwargs, out, module, scratch)
        if self.allocator is not None:
            allocator = self.allocator_of(gpu)
            for i, (name, nbytes) in enumerate(scratch):
                if nbytes:
                    allocator.malloc(("scratch", name, i), nbytes)
            for i, (name, nbytes) in enumerate(scratch):
                if nbytes:
                    allocator.free(("scratch", name, i))
        self._observe(func.__name__, module, scratch)
        return out

    def _workspace(self, name: str, args, gpu: int | None) -> None:
        """A thread's cuBLAS workspace at its first GEMM, after the GEMM's output (a GPU's
        allocator history shows the output's block, then the workspace's); its cuBLASLt
        workspace at its first `addmm` with a vector bias (`gemm_and_bias`, the Lt path).
        Backward runs on autograd's device thread, which has workspaces of its own; a
        checkpointed layer's recomputation runs there too. With devices tracked, the GEMM's
        GPU makes them on its own allocator (each device's thread has its handle)."""
        lt = name.startswith("addmm") and isinstance(args[0], torch.Tensor) and args[0].dim() == 1
        self.make_workspace(self.allocator_of(gpu), 1 if self.phase == BACKWARD else 0, lt)

    def _observe_devices(self, func, args, kwargs, out, module: str, scratch) -> int:
        """Each GPU's highest point; returns the GPU the op ran on."""
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        gpu = self.gpu_of(outs[0]) if outs else None
        if gpu is None:
            gpu = self._output_devices(func, args, kwargs, [None], module)[0]
        if func.__name__.split(".")[0] in GEMM_OPS and gpu not in self.gemm_devices:
            self.gemm_devices.add(gpu)
            if self.allocators is not None and self.make_workspaces is not None and self.make_workspace is None:
                self.make_workspaces(self.allocator_of(gpu), self.workspace_threads)
        persistent = sum(self.persistent.values())
        highs = self.device_peaks.setdefault(self.step, {})
        for d in set(self.by_device) | {gpu}:
            # NB: the persistent scratch (cuBLAS workspaces) is made on a GPU by its first GEMM
            point = self.by_device[d] + (persistent if d in self.gemm_devices else 0) + (sum(b for _, b in scratch) if d == gpu else 0)
            if point > highs.get(d, -1):
                highs[d] = point
        return gpu

    def _observe(self, op: str, module: str, scratch: tuple[tuple[str, int], ...]) -> None:
        scratch = scratch + tuple(self.persistent.items())
        point = self.total + sum(nbytes for _, nbytes in scratch)
        if module in self.watch:
            highs = self.watched.setdefault((self.step, self.phase), {})
            if point > highs.get(module, -1):
                highs[module] = point
        peak = self.peaks.get((self.step, self.phase))
        if peak is None or point > peak.allocated:
            self.peaks[(self.step, self.phase)] = Peak(
                allocated=point,
                traced=self.total,
                phase=self.phase,
                op=op,
                module=module,
                records=list(self.live.values()),
                scratch=scratch,
            )
        if self.keep_timeline:
            self.timeline.append(
                {
                    "step": self.step,
                    "phase": self.phase,
                    "module": module,
                    "op": op,
                    "allocated": point,
                    **{c: self.by_category[c] for c in CATEGORIES if self.by_category[c]},
                    **{f"scratch.{n}": b for n, b in scratch},
                }
            )

    # -- reports --------------------------------------------------------------------------

    def step_peak(self, step: int) -> Peak:
        """The highest point over all phases of `step`."""
        candidates = [p for (s, _), p in self.peaks.items() if s == step]
        return max(candidates, key=lambda p: p.allocated)

    def inventory(self, categories: tuple[str, ...] = (ACTIVATIONS,)) -> list[tuple[str, str, int, int]]:
        """Live storages of `categories` as (module, "dtype[shape] op", count, bytes), largest first."""
        groups: Counter[tuple[str, str]] = Counter()
        counts: Counter[tuple[str, str]] = Counter()
        for record in self.live.values():
            if record.category not in categories:
                continue
            shape = "x".join(str(d) for d in record.shape)
            key = (record.module, f"{record.dtype}[{shape}] {record.op}")
            groups[key] += record.nbytes
            counts[key] += 1
        rows = [(m, what, counts[(m, what)], nbytes) for (m, what), nbytes in groups.items()]
        return sorted(rows, key=lambda r: (-r[3], r[0], r[1]))


class ModuleScope:
    """Which module of `root` is running, in forward, in recomputation and in backward."""

    def __init__(self, root: torch.nn.Module, prefix_map: Callable[[str], str] = lambda s: s) -> None:
        self.names = {m: prefix_map(n) for n, m in root.named_modules()}
        self.param_names = {p: prefix_map(n.rpartition(".")[0]) for n, p in root.named_parameters()}
        self.stack: list[str] = []
        self.starts: list[int] = []  # sequence number at each call's start, ascending
        self.calls: list[list] = []  # [start, end, path, parent index]
        self.open: list[int] = []
        self.in_backward = False
        self.label = ""  # overrides everything when set (e.g. "loss", "optimizer")
        self.marks: list[list] = []  # [start, end, label]: forward code outside any module
        self.handles = []
        for module in self.names:
            self.handles.append(module.register_forward_pre_hook(self._enter))
            self.handles.append(module.register_forward_hook(self._exit, always_call=True))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def reset_calls(self) -> None:
        """Forget the previous forward's call intervals (call before each forward)."""
        self.starts.clear()
        self.calls.clear()
        self.open.clear()
        self.marks.clear()

    def mark(self, label: str) -> None:
        """Name what runs from now on (until `unmark`), in forward and in its backward."""
        self.label = label
        self.marks.append([torch._C._autograd._get_sequence_nr(), None, label])

    def unmark(self) -> None:
        self.label = ""
        if self.marks and self.marks[-1][1] is None:
            self.marks[-1][1] = torch._C._autograd._get_sequence_nr()

    def _enter(self, module, args) -> None:
        path = self.names[module]
        self.stack.append(path)
        if not self.in_backward:
            parent = self.open[-1] if self.open else -1
            seq = torch._C._autograd._get_sequence_nr()
            self.starts.append(seq)
            self.calls.append([seq, None, path, parent])
            self.open.append(len(self.calls) - 1)

    def _exit(self, module, args, output) -> None:
        self.stack.pop()
        if not self.in_backward and self.open:
            self.calls[self.open.pop()][1] = torch._C._autograd._get_sequence_nr()

    def _path_of_node(self, node) -> str:
        variable = getattr(node, "variable", None)
        if variable is not None:  # AccumulateGrad: the parameter's owner
            return self.param_names.get(variable, "")
        seq = node._sequence_nr()
        for start, end, label in self.marks:
            if start <= seq and (end is None or seq < end):
                return label
        i = bisect.bisect_right(self.starts, seq) - 1
        while i >= 0:
            start, end, path, parent = self.calls[i]
            if end is None or seq < end:
                return path
            i = parent
        return ""

    def context(self) -> tuple[str, bool]:
        """(module path, whether this is a checkpoint recomputation inside backward)."""
        if self.label:
            return self.label, False
        if self.in_backward:
            if self.stack:
                return self.stack[-1], True
            node = torch._C._current_autograd_node()
            return (self._path_of_node(node) if node is not None else ""), False
        return (self.stack[-1] if self.stack else ""), False
