"""The step's ledger: what is alive at each moment of the simulated step, and the events the
caching allocator's replay runs.

Contract: `State` holds the resident bytes per module, the gradients, the live saved tensors
and the system buffers (a strategy's rows: `Row`), and keeps `level`, the allocated bytes
without the running layers' transients, up to date. `observe` records one moment of the
timeline (`level` plus the transients of the layers running then) and keeps the highest, as
a `Point` with its module x category breakdown. Every allocation and free is also appended to
`events`, in order, for `compiler.memory.allocator`'s replay. Nothing here knows a
parallelism strategy: the walks in this folder drive it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ...memory import allocator

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "transient")
WORKSPACE = "cublas"  # the breakdown row of the cuBLAS/cuBLASLt workspaces
_ZERO = dict.fromkeys(CATEGORIES, 0)
PROBE = ("probe",)  # replay event: an allocation freed at once (Allocator.probe)
ALLOCATOR_GRANULE = allocator.MIN_BLOCK  # kMinBlockSize: every request rounds up to it


class Row(str):
    """The name of a breakdown row of bytes that belong to no module (a strategy's buffers):
    `category` is the column its bytes count in; a `transient` row shows only while it holds
    bytes. NB: a str, so that the breakdown's keys compare and print as their names."""

    category: str
    transient: bool

    def __new__(cls, name: str, category: str = "gradients", transient: bool = False) -> "Row":
        row = super().__new__(cls, name)
        row.category, row.transient = category, transient
        return row


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def div(n: int, d: int) -> int:
    """`n` split `d` ways, rounded up: the share of the rank that holds the most."""
    return -(-n // d)


def push(stack: Mapping[str, int], module: str, extra: int) -> Mapping[str, int]:
    """The transients of the layers running (module -> bytes), with `extra` on `module`."""
    if not extra:
        return stack  # NB: never mutated, so sharing it is safe and saves a copy per layer
    out = dict(stack)
    out[module] = out.get(module, 0) + extra
    return out


@dataclass(frozen=True)
class Point:
    phase: str  # forward | backward | optimizer
    path: str  # the layer running, or "optimizer.step"
    total: int
    breakdown: Mapping[str, Mapping[str, int]]  # module -> category -> bytes


@dataclass
class State:
    modules: tuple[str, ...]
    resident: dict  # module -> {parameters (buffers included), optimizer_states}, per GPU
    owner: dict  # tensor -> owning path
    grads: dict = field(default_factory=dict)  # module -> bytes
    live: dict = field(default_factory=dict)  # tensor -> (module, bytes)
    live_by_module: dict = field(default_factory=dict)
    kept: set = field(default_factory=set)  # names saved for backward (not only held)
    buffers: dict = field(default_factory=dict)  # system buffers (DeepSpeed buckets) -> bytes
    best: Point | None = None
    best_first: tuple | None = None
    timeline: list = field(default_factory=list)

    level: int = 0  # resident + workspaces + gradients + live saved tensors, kept up to date
    workspace: int = 0  # cuBLAS/cuBLASLt workspaces of a steady-state step
    first_forward_workspace: int = 0  # step 1's forward has run GEMMs on one thread only
    optim_resident: int = 0  # optimizer bytes that appear only at the first step()
    first_optim: dict = field(default_factory=dict)  # module -> optimizer bytes already there in step 1
    # The step's allocations and frees in order, (key, bytes) and (key, None), for the
    # caching allocator's replay (compiler.memory.allocator); see `replay_events`
    events: list = field(default_factory=list)
    buffer_keys: dict = field(default_factory=dict)  # buffer name -> [(key, bytes)] live, oldest first
    grad_keys: dict = field(default_factory=dict)  # layer path -> [(key, bytes)] live
    persisted: dict = field(default_factory=dict)  # module -> composites' transients held (hold)
    serial: int = 0
    incoming: dict = field(default_factory=dict)  # name -> key allocated ahead of the leaf's order

    def _new_key(self, kind: str, name: str) -> tuple:
        self.serial += 1
        return (kind, name, self.serial)

    def add_grad(self, module: str, path: str, size: int, pieces: list[int] | None = None) -> None:
        """A layer's gradients appear: one allocation, or one per tensor (`pieces`, summing
        to `size`)."""
        if size:
            for b in pieces or (size,):
                key = self._new_key("grad", path)
                self.events.append((key, b))
                self.grad_keys.setdefault(path, []).append((key, b))
            self.grads[module] = self.grads.get(module, 0) + size
            self.level += size

    def drop_grad(self, module: str, path: str, size: int) -> None:
        if size:
            for key, _ in self.grad_keys.pop(path, ()):
                self.events.append((key, None))
            self.grads[module] -= size
            self.level -= size

    def drop_grads(self) -> None:
        """Every gradient goes (zero_grad(set_to_none=True), or ZeRO-1's reduction)."""
        for keys in self.grad_keys.values():
            for key, _ in keys:
                self.events.append((key, None))
        self.grad_keys.clear()
        for m in list(self.grads):
            self.level -= self.grads[m]
            self.grads[m] = 0

    def charge(self, module: str, tensors, kept: bool = False) -> None:
        for name, size in tensors:
            if kept:
                self.kept.add(name)
            if name not in self.live:
                size = round_up(size, ALLOCATOR_GRANULE)
                if size:
                    self.events.append((("tensor", name), size))
                self.live[name] = (module, size)
                self.live_by_module[module] = self.live_by_module.get(module, 0) + size
                self.level += size

    def add_buffer(self, name: str, size: int) -> None:
        """A system buffer (not a module's) alive from now on, shown in its own breakdown row."""
        if size:
            key = self._new_key("buffer", name)
            self.events.append((key, size))
            self.buffer_keys.setdefault(name, []).append((key, size))
            self.buffers[name] = self.buffers.get(name, 0) + size
            self.level += size

    def drop_buffer(self, name: str, size: int) -> None:
        if size:
            self._free_buffer(name, size)
            self.buffers[name] -= size
            self.level -= size
            if not self.buffers[name] and getattr(name, "transient", False):
                del self.buffers[name]  # NB: a transient row shows only while it holds bytes

    def _free_buffer(self, name: str, size: int) -> None:
        """Free the allocation of buffer `name` made with `size` (the latest such), or the
        latest ones until `size` is freed."""
        keys = self.buffer_keys.get(name, [])
        for i in range(len(keys) - 1, -1, -1):
            if keys[i][1] == size:
                self.events.append((keys.pop(i)[0], None))
                return
        while size > 0 and keys:
            key, nbytes = keys.pop()
            self.events.append((key, None))
            size -= nbytes

    def _drop(self, name: str) -> None:
        module, size = self.live.pop(name)
        if size:
            self.events.append((("tensor", name), None))
        self.live_by_module[module] -= size
        self.level -= size

    def release(self, tensors) -> None:
        """Free the forward's held outputs, except those something saved for backward."""
        for name, _ in tensors:
            if name in self.live and name not in self.kept:
                self._drop(name)

    def free(self, path: str, tensors) -> None:
        """Free the tensors `path` charged, once its backward has run."""
        for name, _ in tensors:
            if self.owner.get(name) == path and name in self.live:
                self._drop(name)

    def free_pinned(self, names) -> None:
        for name in names:
            if name in self.live:
                self._drop(name)

    def observe(
        self,
        phase: str,
        path: str,
        transient: Mapping[str, int],
        own: tuple[str, int] = ("", 0),
        order: tuple = (),
        backward: bool = False,
        pieces: tuple[tuple[str, int], ...] = (),
    ) -> None:
        """`own`: the running leaf's module and its own transient bytes (inside that module's
        entry of `transient`, with the transients of the composites around it). `order`: the
        leaf's allocation order for this phase (evaluate.Cost.allocations_*), which the replay
        runs in place of its own transient as one allocation; `backward`: the leaf's backward (its
        saved tensors are freed where the order names them), else a forward or recomputation."""
        # NB: a transient is allocated for the moment observed and freed after it: the running
        # leaf's own as one allocation, the rest of each module's stack as another
        module, mine = own
        temporary = {} if backward or not order else {name: size for op, name, size in order if op == "saved" and name not in self.live}
        # NB: `pieces`, the leaf's saved tensors where it keeps none (a checkpointing unit's
        # first forward), exist as the tensors they are, each its own allocation, unless the
        # leaf's order makes them
        pieces = tuple(b for name, b in pieces if name not in temporary) if pieces else ()
        keys = []
        for m, size in transient.items():
            size -= self.persisted.get(m, 0)
            if m != module:
                parts = (size,)
            elif order:
                # NB: the leaf's own tensors come in their order below; a saved tensor not kept
                # (a checkpointing unit's first forward) is in its module's entry as well
                parts = (size - mine - sum(temporary.values()) - sum(pieces), *pieces)
            else:
                parts = (size - mine - sum(pieces), *pieces, mine)
            for b in parts:
                if b > 0:
                    self.serial += 1  # NB: _new_key, inlined (the replay's hottest producer)
                    keys.append((("transient", m, self.serial), b))
        if order:
            self.events.extend(keys)
            self._ordered(order, temporary, backward, module)
            self.events.extend((key, None) for key, _ in keys)
        elif len(keys) == 1:
            self.events.append((PROBE, keys[0][1]))
        else:
            self.events.extend(keys)
            self.events.extend([(key, None) for key, _ in keys])
        total = self.level + sum(transient.values())
        self.timeline.append((phase, path, total))
        if self.best is None or total > self.best.total:
            self.best = self._point(phase, path, total, transient)
        first = total - self.optim_resident - (self.workspace - self.first_forward_workspace if phase == "forward" else 0)
        if phase != "optimizer" and (self.best_first is None or first > self.best_first[2]):
            # NB: a snapshot, made into a Point once at the end: this branch runs on most
            # forward events.
            self.best_first = (phase, path, first, dict(self.grads), dict(self.live_by_module), transient, dict(self.buffers))

    def hold(self, module: str, size: int) -> tuple | None:
        """A composite's transient, allocated for the replay as its children start and kept
        through them (the tensors it holds between its children: an MLP's intermediates);
        the moments observed meanwhile allocate only what is above it. The timeline's figures
        are `observe`'s `transient`, which counts it already."""
        if size <= 0:
            return None
        key = self._new_key("transient", module)
        self.events.append((key, size))
        self.persisted[module] = self.persisted.get(module, 0) + size
        return key, size, module

    def unhold(self, held: tuple | None) -> None:
        if held is not None:
            key, size, module = held
            self.events.append((key, None))
            self.persisted[module] -= size

    def _ordered(self, order: tuple, temporary: Mapping[str, int], backward: bool, module: str = "") -> None:
        """Append a leaf's allocation order to `events`: its transient tensors, and its saved
        tensors where they are made (forward) or freed (backward); an allocation named by
        `grad` becomes the gradient in place of the one charged for it (`_regrad`); what it
        allocated and did not free is freed at its end. NB: the saved tensor's own event is the ledger's (charge
        and free); a free the ledger sends again later is one the replay ignores."""
        made: dict[str, tuple] = {}
        sizes: dict[tuple, int] = {}
        for op, name, size in order:
            if op == "alloc" or op == "output":
                if name in self.incoming:
                    made[name] = self.incoming.pop(name)
                elif size:
                    # NB: an output's key kind marks it for orders.handed_on
                    made[name] = key = self._new_key("transient" if op == "alloc" else "output", name)
                    sizes[key] = size
                    self.events.append((key, size))
            elif op == "free":
                key = made.pop(name, None)
                if key is not None:
                    self.events.append((key, None))
            elif op == "grad":
                key = made.pop(name, None)
                if key is not None:
                    self._regrad(module, key, sizes[key])
            elif name in temporary:
                made[name] = key = self._new_key("transient", name)
                self.events.append((key, temporary[name]))
            elif name in self.live and self.live[name][1]:
                self.events.append((("tensor", name), None if backward else self.live[name][1]))
        self.events.extend((key, None) for key in made.values())

    def _regrad(self, module: str, key: tuple, size: int) -> None:
        """`key` (an allocation of `size` bytes) becomes the gradient that `module`'s first
        gradient of that size held, which is freed: a tied table's two gradients summed out of
        place, the sum kept as the .grad where the sharing layer's was charged."""
        for path, keys in self.grad_keys.items():
            if path == module or path.startswith(module + "."):
                for i, (old, b) in enumerate(keys):
                    if b == size:
                        keys[i] = (key, b)
                        self.events.append((old, None))
                        return
        self.events.append((key, None))

    def incoming_grad(self, size: int) -> None:
        """The running leaf's incoming gradient, allocated ahead of its weight gradients: its
        allocation order's first `{alloc: grad_out}` takes this block instead of making one."""
        key = self._new_key("transient", "grad_out")
        self.events.append((key, size))
        self.incoming["grad_out"] = key

    def first_point(self) -> Point:
        phase, path, total, grads, live, transient, buffers = self.best_first
        state = State(self.modules, self.resident, self.owner, grads, {}, live)
        state.buffers = buffers
        state.first_optim = self.first_optim
        state.workspace = self.first_forward_workspace if phase == "forward" else self.workspace
        point = state._point(phase, path, total, transient)
        for m, cats in point.breakdown.items():
            cats["optimizer_states"] = self.first_optim.get(m, 0)
        return point

    def _point(self, phase: str, path: str, total: int, transient: Mapping[str, int]) -> Point:
        return Point(phase, path, total, self._breakdown(transient))

    def _breakdown(self, transient: Mapping[str, int]) -> dict:
        out = {}
        # NB: cuBLAS workspaces belong to no module; a row of their own keeps the sum exact.
        for m in self.modules:
            r = self.resident.get(m, {})
            out[m] = {
                "parameters": r.get("parameters", 0),
                "gradients": self.grads.get(m, 0),
                "optimizer_states": r.get("optimizer_states", 0),
                "activations": self.live_by_module.get(m, 0),
                "transient": transient.get(m, 0),
            }
        out[WORKSPACE] = {**_ZERO, "transient": self.workspace}
        for name, size in self.buffers.items():
            out[name] = {**_ZERO, getattr(name, "category", "gradients"): size}
        return out
