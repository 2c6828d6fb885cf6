"""torch's optimizer.step() on the GPU: the tensors it steps and what it holds beside them.

Contract: `stepped_tensors` lists the tensors the optimizer steps, in its order, with their
parameter groups; `step_temporaries` gives the steady step's temporaries (master gradients,
foreach copies), `_step_events` the same as the allocations the caching allocator's replay
runs, and `first_step_high_water` / `_first_step_optimizer` step 1's high-water mark, when
step() makes the states as it goes. The ZeRO and FSDP2 walks step flat partitions or shards
and reuse `step_temporaries` on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ...memory import optimizers
from ..evaluate import trained
from ..resolve import Setup
from .timeline import ALLOCATOR_GRANULE, Point, div, round_up


def _states(setup: Setup, elements: int, shape) -> tuple:
    return optimizers.states(setup.optimizer, elements, shape, setup.state_bytes)


def _paged_bytes(nodes, setup: Setup) -> int:
    """bitsandbytes' paged states: CUDA unified memory (cudaMallocManaged), never in
    torch.cuda.max_memory_allocated."""
    if not setup.optimizer.paged:
        return 0
    return sum(s.nbytes for e, shape in _trainable_tensors(nodes, setup) for s in _states(setup, e, shape) if s.paged)


def _trainable_elements(nodes, setup: Setup) -> int:
    """Parameters the optimizer steps: those with gradients, and those with flat states
    (their fp32 gradients are zero-filled and stepped like the others)."""
    return sum(
        t // setup.bytes["param"]
        for r in nodes
        for n in r.walk()
        if n.inst.trainable or n.inst.flat_states or n.inst.bias_only
        for t in trained(n.inst, n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names)[0]
    )


def _trainable_tensors(nodes, setup: Setup) -> list[tuple[int, tuple[int, ...] | None]]:
    """(element count, shape) of every tensor the optimizer steps."""
    return [
        (t // setup.bytes["param"], shape)
        for r in nodes
        for n in r.walk()
        if n.inst.trainable or n.inst.flat_states or n.inst.bias_only
        for t, shape in zip(*trained(n.inst, n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names))
    ]


@dataclass(frozen=True)
class Stepped:
    """One tensor the optimizer steps: its elements, dims (where the formula gives them), the
    module it belongs to and its parameter group."""

    elements: int
    shape: tuple[int, ...] | None
    module: str = ""
    group: int = 0


def stepped_tensors(nodes, setup: Setup) -> list[Stepped]:
    """The stepped tensors in the order the optimizer visits them: group by group, each in
    named_parameters() order (torch/optim/optimizer.py: `for group in self.param_groups`;
    Trainer.create_optimizer fills each group in named_parameters() order).

    named_parameters() follows registration (each module's __init__), taken here as the
    layers' forward order; a tied table (an embedding with shared_weight, whose weight the
    lm_head counts) is visited at the embedding's place, where it is registered first.
    NB: a decoder layer registers its norms after attention and MLP (Qwen2DecoderLayer.__init__)
    and runs them before: in forward order a norm's tiny states count as made earlier, an
    over-estimate of the lazily made states at a per-parameter loop's high-water mark.
    """
    opt = setup.optimizer
    out: list[Stepped] = []
    tied: list[tuple[int, tuple[int, int]]] = []  # (position, table shape) of each tied embedding
    for r in nodes:
        for n in r.walk():
            if n.inst.scope.get("shared_weight") and n.inst.trainable:
                tied.append((len(out), (n.inst.scope["vocab"], n.inst.scope["dim"])))
            if not (n.inst.trainable or n.inst.flat_states or n.inst.bias_only):
                continue
            for t, shape, name in zip(n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names or ("weight",) * len(n.cost.param_tensors)):
                if n.inst.bias_only and name != "bias":
                    continue  # NB: peft's bias option: the weight stays frozen
                group = opt.group_of(f"{n.inst.path}.{name}", n.inst.formula.module_class)
                out.append(Stepped(t // setup.bytes["param"], shape, n.inst.module, group))
    for at, shape in reversed(tied):
        later = next((i for i in range(at, len(out)) if out[i].shape == shape), None)
        if later is not None:
            out.insert(at, out.pop(later))
    return sorted(out, key=lambda t: t.group)  # NB: stable: each group keeps its order


def _largest_trainable_tensor(nodes, setup: Setup) -> int:
    """Elements of the largest parameter tensor that requires grad (DeepSpeed's largest_param_numel)."""
    return max(
        (
            t // setup.bytes["param"]
            for r in nodes
            for n in r.walk()
            if n.inst.trainable or n.inst.flat_states or n.inst.bias_only
            for t in trained(n.inst, n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names)[0]
        ),
        default=0,
    )


def _largest_trainable(nodes, setup: Setup) -> int:
    return max(
        (
            sum(trained(n.inst, n.cost.param_tensors, n.cost.param_shapes, n.cost.param_names)[0]) // setup.bytes["param"]
            for r in nodes
            for n in r.walk()
            if (n.inst.trainable or (n.inst.bias_only and n.inst.grad_flows)) and not n.children
        ),
        default=0,
    )


def step_temporaries(setup: Setup, tensors: list[Stepped], largest: int, o_div: int = 1) -> dict[str, int]:
    """Bytes alive only during optimizer.step(), per GPU, for the stepped tensors
    (unsharded: each its own allocation; sharded: one flat partition per parameter group).

    torch's optimizers step one parameter group after the other (torch/optim/adam.py and
    sgd.py, step: `for group in self.param_groups`, then one foreach or for-loop call on
    that group's tensors, grouped by device and dtype, Optimizer._group_tensors_by_device_and_dtype),
    so a foreach temporary is the largest group's, not the whole model's:

    - master_grads: mixed precision converts the 16-bit gradients to fp32 for the master
      weights before step() (DeepSpeed converts the whole flat partition at once; DOMAIN.md);
    - foreach Adam/AdamW: `torch._foreach_sqrt(exp_avg_sqs)` returns a new tensor per state, a
      full copy of the group's second moments (torch/optim/adam.py, _multi_tensor_adam). Adam's
      coupled weight decay first makes `device_grads = torch._foreach_add(grads, params)`, a
      copy of the group's gradients in the same dtype, deleted (`del device_grads`) before the
      sqrt: the two never coexist, so the peak is the sqrt's either way;
    - for-loop Adam/AdamW: `exp_avg_sq.sqrt()` and its quotient by the bias correction, one
      parameter at a time: two copies of the largest parameter's state; Adam's coupled
      weight decay adds `grad = grad.add(param, alpha=weight_decay)`, a third, alive
      through the update (_single_tensor_adam);
    - SGD with weight decay: foreach `torch._foreach_add(device_grads, device_params)`, a
      copy of every gradient of a group with weight decay, alive through the group's step;
      for-loop `grad.add(param)`, one parameter's (torch/optim/sgd.py);
    - Adafactor (transformers): parameter by parameter; see `_adafactor_temporaries`;
    - fused AdamW, SGD without weight decay and bitsandbytes (fused CUDA kernels, in place)
      allocate none.
    """

    out = {"master_grads": _allocated(setup.master_bytes, tensors, o_div) if setup.master_bytes else 0}
    temporaries = max((t for _, t in group_temporaries(setup, tensors, largest, o_div)), default=0)
    if temporaries:
        out["optimizer_temporaries"] = temporaries
    return out


def _allocated(nbytes: int, tensors: list[Stepped], o_div: int) -> int:
    """`nbytes` per element of `tensors`: each its own allocation, or one flat partition
    of the ranks' share (ZeRO: one per parameter group, stage_1_and_2.py bit16_groups_flat)."""
    if o_div > 1:
        return div(sum(t.elements for t in tensors) * nbytes, o_div)
    return sum(round_up(t.elements * nbytes, ALLOCATOR_GRANULE) for t in tensors)


def param_groups(tensors: list[Stepped]) -> list[tuple[int, list[Stepped]]]:
    """(group, its tensors) for every group with a tensor, in the optimizer's order."""
    groups: dict[int, list[Stepped]] = {}
    for t in tensors:
        groups.setdefault(t.group, []).append(t)
    return sorted(groups.items())


def group_temporaries(setup: Setup, tensors: list[Stepped], largest: int, o_div: int = 1) -> list[tuple[int, int]]:
    """(group, the most its step() call holds at once beside the states) for every group,
    in order; see step_temporaries. Adafactor's is the group's largest tensor's."""
    opt = setup.optimizer
    one = round_up(setup.state_bytes * largest, ALLOCATOR_GRANULE)
    out = []
    for g, members in param_groups(tensors):
        decay = opt.group_decay(g)
        temp = 0
        if opt.type in ("adamw", "adam") and not opt.bnb:
            if opt.impl == "foreach":
                temp = _allocated(setup.state_bytes, members, o_div)
            elif opt.impl == "forloop":
                # NB: the largest layer's parameters (weight and bias together) stand for the
                # largest tensor, and its group's decay for every group's: an upper bound
                coupled = opt.type == "adam" and opt.weight_decay > 0
                temp = (3 if coupled else 2) * one
        elif opt.type == "sgd" and decay > 0:
            temp = _allocated(setup.state_bytes, members, o_div) if opt.impl == "foreach" else one
        elif opt.type == "adafactor":
            temp = max((_adafactor_temporaries(setup, t.elements, t.shape) for t in members), default=0)
        out.append((g, temp))
    return out


def _first_step_events(setup: Setup, tensors: list[Stepped], largest: int, once: list[int]) -> list:
    """Step 1's step() in order, for the allocator's replay, where the states appear: the fp32
    master copies of every tensor (made at the first step, before the gradients' copies), the
    master gradients, optimizer-wide tensors (`once`), then group by group `_init_group`'s
    states, tensor by tensor in the optimizer's order with each tensor's states together
    (torch/optim/adam.py: exp_avg, then exp_avg_sq), before the group's temporaries. The
    states stay; the rest is freed as in the steady step (`_step_events`)."""
    steady = _step_events(setup, tensors, largest)
    events: list = []
    if setup.master_bytes:
        events += [(("master", i), round_up(t.elements * setup.master_bytes, ALLOCATOR_GRANULE)) for i, t in enumerate(tensors)]
    events += [e for e in steady if e[0][0] == "master-grad" and e[1] is not None]
    events += [(("once", i), round_up(b, ALLOCATOR_GRANULE)) for i, b in enumerate(once) if b]
    if setup.optimizer.type == "adafactor":  # its states are made inside the loop
        events += _adafactor_events(setup, tensors, first=True)
    else:
        for g, _ in param_groups(tensors):
            for i, t in enumerate(tensors):
                if t.group == g:
                    events += [
                        (("state", i, j), round_up(x.nbytes, ALLOCATOR_GRANULE))
                        for j, x in enumerate(_states(setup, t.elements, t.shape))
                        if not x.paged and x.nbytes
                    ]
            events += [e for e in steady if e[0][0] == "step" and e[0][1] == g]
    events += [e for e in steady if e[0][0] == "master-grad" and e[1] is None]
    return events


def _step_events(setup: Setup, tensors: list[Stepped], largest: int) -> list:
    """An unsharded step()'s allocations in order, for the allocator's replay: the fp32
    gradients of the master weights (each tensor's, made before the step, alive through it),
    then group by group the foreach temporaries, one per tensor (`_foreach_sqrt`'s results,
    `_foreach_add`'s gradient copies: made together, freed after the group's update), for-loop
    Adam and AdamW's tensor by tensor (`_forloop_adam_events`), or another for-loop
    optimizer's temporaries of its largest tensor (see step_temporaries)."""
    opt = setup.optimizer
    events: list = []
    masters = []
    if setup.master_bytes:
        for i, t in enumerate(tensors):
            masters.append(("master-grad", i))
            events.append((masters[-1], round_up(t.elements * setup.master_bytes, ALLOCATOR_GRANULE)))
    if opt.type == "adafactor":
        events += _adafactor_events(setup, tensors, first=False)
    else:
        events += _group_step_events(setup, tensors, largest)
    events += [(key, None) for key in masters]
    return events


def _group_step_events(setup: Setup, tensors: list[Stepped], largest: int) -> list:
    """torch's optimizers group by group (see `_step_events`)."""
    opt = setup.optimizer
    temporaries = dict(group_temporaries(setup, tensors, largest))
    events: list = []
    for g, members in param_groups(tensors):
        if opt.impl == "forloop" and opt.type in ("adamw", "adam") and not opt.bnb:
            events += _forloop_adam_events(setup, g, members, coupled=opt.type == "adam" and opt.group_decay(g) > 0)
            continue
        foreach = opt.impl == "foreach" and ((opt.type in ("adamw", "adam") and not opt.bnb) or (opt.type == "sgd" and opt.group_decay(g) > 0))
        sizes = [round_up(t.elements * setup.state_bytes, ALLOCATOR_GRANULE) for t in members] if foreach else [temporaries[g]]
        keys = [(("step", g, i), size) for i, size in enumerate(sizes) if size]
        events += keys
        events += [(key, None) for key, _ in keys]
    return events


class _Locals:
    """A Python step function's local names, for the allocator's replay: binding a name to a
    new tensor makes it (and frees `dropped`, a temporary of the same expression), then frees
    what the name held; binding it to no new tensor (a state, a parameter's own gradient)
    frees only that. What the names hold at the end goes when the function returns."""

    def __init__(self) -> None:
        self.events: list = []
        self.held: dict[str, tuple] = {}

    def make(self, key: tuple, size: int) -> None:
        self.events.append((key, size))

    def free(self, key: tuple) -> None:
        self.events.append((key, None))

    def bind(self, name: str, key: tuple | None = None, size: int = 0, dropped: tuple | None = None) -> None:
        if key is not None:
            self.events.append((key, size))
        if dropped is not None:
            self.events.append((dropped, None))
        if name in self.held:
            self.events.append((self.held.pop(name), None))
        if key is not None:
            self.held[name] = key

    def returned(self) -> list:
        return self.events + [(key, None) for key in self.held.values()]


def _forloop_adam_events(setup: Setup, g: int, members: list[Stepped], coupled: bool) -> list:
    """torch's for-loop Adam and AdamW on one group, tensor by tensor, for the allocator's
    replay (torch/optim/adam.py, _single_tensor_adam): Adam's coupled weight decay makes
    `grad = grad.add(param, alpha=weight_decay)`, freed as the next tensor's `grad` is bound;
    `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` makes the square root,
    then the quotient, and frees the square root; the previous tensor's `denom` is freed as
    the name is bound again. The last tensor's go when the function returns."""
    names = _Locals()
    for i, t in enumerate(members):
        size = round_up(t.elements * setup.state_bytes, ALLOCATOR_GRANULE)
        if coupled:  # `grad = grads[i]` frees the previous copy, then `grad = grad.add(param, ...)`
            names.bind("grad")
            names.bind("grad", ("step", g, i, "grad"), size)
        root = ("step", g, i, "sqrt")
        names.make(root, size)
        names.bind("denom", ("step", g, i, "denom"), size, dropped=root)
    return names.returned()


def _adafactor_events(setup: Setup, tensors: list[Stepped], first: bool) -> list:
    """transformers' Adafactor.step for the allocator's replay, parameter by parameter over
    every group (transformers/optimization.py; fp32 throughout): a 16-bit gradient's and
    weight's fp32 copies (`grad.float()`, `p.float()`, each freed as the next parameter's
    name is bound); at the first step the parameter's states, made there; `update =
    (grad**2) + eps` (the square freed at once, the previous update as the name is bound);
    the factored product of the row and column factors, or `exp_avg_sq.rsqrt()`, a new update
    (the old one freed); with a first moment `update = exp_avg` frees it; `-update` for
    `p.add_`, freed at once. The last parameter's copies go when step() returns."""
    sixteen = not setup.master_bytes and setup.bytes["param"] < optimizers.FP32
    momentum = setup.optimizer.momentum > 0
    names = _Locals()
    for i, t in enumerate(tensors):
        n4 = round_up(optimizers.FP32 * t.elements, ALLOCATOR_GRANULE)
        if sixteen:  # `grad = p.grad` frees the previous copy, then `grad = grad.float()`
            names.bind("grad")
            names.bind("grad", ("step", t.group, i, "grad"), n4)
        if first:
            for j, x in enumerate(_states(setup, t.elements, t.shape)):
                if x.nbytes:
                    names.make(("state", i, j), round_up(x.nbytes, ALLOCATOR_GRANULE))
        if sixteen:  # `p_data_fp32 = p`, then `p_data_fp32 = p_data_fp32.float()`
            names.bind("p")
            names.bind("p", ("step", t.group, i, "p"), n4)
        square = ("step", t.group, i, "square")
        names.make(square, n4)
        names.bind("update", ("step", t.group, i, "update"), n4, dropped=square)
        names.bind("update", ("step", t.group, i, "factor"), n4)
        if momentum:
            names.bind("update")  # `update = exp_avg`
        negated = ("step", t.group, i, "negated")
        names.make(negated, n4)
        names.free(negated)
    return names.returned()


def _adafactor_temporaries(setup: Setup, elements: int, shape: tuple[int, ...] | None) -> int:
    """The most transformers' Adafactor.step holds at once for one parameter (fp32 throughout):

    `grad.float()` and `p.float()` when they are 16-bit (no master copy); `update = grad**2 + eps`
    (grad**2 freed once the sum exists); factored: `_approx_sq_grad` builds r_factor (the row
    vector's size) and c_factor (the column vector's) and their product, a new update, while
    the old one is alive; unfactored: `exp_avg_sq.rsqrt()` next to the old update. Later
    `p_data_fp32.add_(-update)` holds two parameter-sized tensors again, never more.
    """
    n4 = round_up(optimizers.FP32 * elements, ALLOCATOR_GRANULE)
    sixteen = not setup.master_bytes and setup.bytes["param"] < optimizers.FP32
    upcasts = 2 * n4 if sixteen else 0  # grad.float(), p.float()
    if shape is not None and optimizers.adafactor_factored(shape):
        rows, cols = optimizers.adafactor_vectors(shape)
        vectors = round_up(optimizers.FP32 * rows, ALLOCATOR_GRANULE) + round_up(optimizers.FP32 * cols, ALLOCATOR_GRANULE)
        return upcasts + 2 * n4 + vectors
    return upcasts + 2 * n4


def _created_states(setup: Setup, t: Stepped) -> int:
    """Allocated bytes of the states step() makes for one tensor (not the fp32 master
    copy, which exists before step(); not bitsandbytes' paged states, outside the allocator)."""
    return sum(round_up(x.nbytes, ALLOCATOR_GRANULE) for x in _states(setup, t.elements, t.shape) if not x.paged)


def first_step_high_water(setup: Setup, tensors: list[Stepped], largest: int) -> tuple[int, dict[str, int], int]:
    """The most step 1's optimizer.step() holds beyond the master gradients, unsharded:
    (states made so far + the temporaries then, those states per module, the temporaries).

    Step 1 makes the states inside step(), so its high-water mark is not the steady
    step's (every state + the largest temporaries):
    - torch's Adam, AdamW and SGD step group by group: `_init_group` makes the group's states
      (Adam: exp_avg and exp_avg_sq of every tensor, torch/optim/adam.py, Adam._init_group;
      SGD: the momentum buffers, cloned one by one inside the group's call, sgd.py
      _multi_tensor_sgd, all alive by its end beside the weight-decay copy), then the
      group's call runs with its temporaries: the mark is the largest of (states of this
      and the earlier groups + this group's temporaries);
    - transformers' Adafactor (optimization.py, Adafactor.step) and bitsandbytes
      (Optimizer8bit.step -> init_state) make a tensor's states when the per-parameter loop
      reaches it: the mark is the largest of (states of the tensors visited so far, this
      one's included, + this tensor's temporaries), in the loop's order (stepped_tensors).
    NB: bitsandbytes' quantile maps (optimizers.once) are not counted here; with no
    temporaries its mark is at the last tensor, every state made, as in the steady step.
    """
    best = (-1, {}, 0)
    made: dict[str, int] = {}
    total = 0
    per_tensor = setup.optimizer.type == "adafactor" or setup.optimizer.bnb
    for g, temp in group_temporaries(setup, tensors, largest):
        members = [t for t in tensors if t.group == g]
        for t in members:
            nbytes = _created_states(setup, t)
            made[t.module] = made.get(t.module, 0) + nbytes
            total += nbytes
            if per_tensor:
                now = _adafactor_temporaries(setup, t.elements, t.shape) if setup.optimizer.type == "adafactor" else 0
                if total + now > best[0]:
                    best = (total + now, dict(made), now)
        if not per_tensor and total + temp > best[0]:
            best = (total + temp, dict(made), temp)
    return best if best[0] >= 0 else (0, {}, 0)


def _first_step_optimizer(setup: Setup, tensors: list[Stepped], largest: int, step: Point, step_transient: Mapping[str, int], modules) -> Point:
    """Step 1's optimizer.step() at its high-water mark: the steady step's point with only
    the states made so far and the temporaries of that moment (first_step_high_water)."""
    high, made, temp = first_step_high_water(setup, tensors, largest)
    all_made = {}
    for t in tensors:
        all_made[t.module] = all_made.get(t.module, 0) + _created_states(setup, t)
    steady_temp = sum(step_transient.values())
    master = step_temporaries(setup, tensors, largest).get("master_grads", 0)
    total = step.total - steady_temp - sum(all_made.values()) + master + high
    breakdown = {m: dict(c) for m, c in step.breakdown.items()}
    for m, nbytes in all_made.items():
        breakdown[m]["optimizer_states"] -= nbytes - made.get(m, 0)
    for m in modules:
        breakdown[m]["transient"] = 0
    breakdown[modules[-1]]["transient"] = master + temp
    return Point("optimizer", "optimizer.step", total, breakdown)
