"""`memspec fit`: the largest micro-batch, the longest sequence and the smallest data-parallel
degree that fit a GPU, and what to change when the setup does not.

Contract: `fit(spec, setup, gpu, margin, resolve)` returns a `FitReport`. A setup fits when
the caching allocator's replay never runs out of the GPU's memory and its `device` figure
(what nvidia-smi would show: reserved + CUDA context, + NCCL when dp > 1) is at most the
GPU's memory less the margin (`--margin`, else the catalog's device.margin_pct, the
estimate's measured error). Each answer is found by galloping then bisecting on a knob whose
peak grows with it (micro-batch, sequence) or shrinks with it (data-parallel degree under
ZeRO), with a bracket narrowed by interpolation (the peak is close to linear in each knob)
and bisection, re-running only expand -> evaluate -> simulate on the already loaded spec and
formulas. Every answer comes with the next value, which does not fit. When the setup as
given does not fit and `resolve` is given, the levers of `levers.py` are tried one at a
time: at micro-batch 1 when not even that fits, else at the micro-batch as given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ..api import Node, Report, image_tokens_per_sample, run
from ..errors import MemspecError
from ..pipeline.resolve import Gpu, Margin, Setup, Spec, gpu_catalog, vision_chunk_micro_batch
from .levers import EXPANDABLE_SEGMENTS, Lever, levers, within

# Search bounds: beyond these the question is not one of a single GPU type.
MAX_MICRO_BATCH = 4096
MAX_SEQ = 1 << 20
MAX_DP = 4096


@dataclass(frozen=True)
class Answer:
    knob: str  # micro_batch | seq_len | dp
    value: int | None  # largest (dp: smallest) that fits; None when none in the bounds does
    device: int | None  # its device figure
    next_value: int | None  # the neighbour that does not fit; None at the bound
    next_device: int | None
    evaluations: int


@dataclass(frozen=True)
class FitReport:
    gpu: Gpu
    margin: Margin
    budget: int  # bytes a setup's device figure may reach
    base: Report  # the setup as given
    micro_batch: Answer
    seq_len: Answer
    dp: Answer | None  # only when ZeRO shards something
    context_length: int | None = None  # the sequence search's bound, when the spec gives one
    micro_batch_bound: int | None = None  # the micro-batch search's, when the model's tower bounds it (E725)
    levers: tuple[Lever, ...] = ()  # when the setup as given does not fit
    levers_at: int | None = None  # the micro-batch the levers were tried at
    # the largest micro-batch under expandable_segments:True with its catalog margin, when the
    # setup keeps torch's allocator defaults and the catalog's margin (None otherwise)
    expandable: Answer | None = None
    expandable_margin: Margin | None = None

    @property
    def fits(self) -> bool:
        """The setup as given fits (the estimate's verdict with this margin)."""
        return within(self.base, self.budget)


class _Probe:
    """device figure of the setup with one knob changed, memoised."""

    def __init__(self, spec: Spec, change: Callable[[int], Setup], budget: int, nodes: tuple[Node, ...] | None = None, reuse: dict | None = None):
        self.spec, self.change, self.budget = spec, change, budget
        self.nodes = nodes  # the layers, when the knob is one that expand and evaluate do not read
        self.reuse = reuse  # the search's modules already expanded and evaluated (api.run)
        self.device: dict[int, int] = {}
        self.oom: set[int] = set()  # values whose replay ran out of the GPU's memory
        self.bound: set[int] = set()  # values whose device figure is a lower bound past the budget
        self.runs = 0  # estimates made (the setup's own figure is given, not made)

    def know(self, x: int, report: Report) -> None:
        """Record the estimate at `x` (made here, or the setup as given, made before)."""
        self.device[x] = report.device
        self.oom.discard(x)
        self.bound.discard(x)
        if report.estimate.oom is not None:
            self.oom.add(x)
        if report.estimate.reserved_bound:
            self.bound.add(x)

    def _run(self, x: int, verdict_only: bool) -> None:
        budget = self.budget if verdict_only else None
        self.know(x, run(self.spec, self.change(x), table=False, nodes=self.nodes, reuse=self.reuse, verdict_budget=budget))
        self.runs += 1

    def fits(self, x: int) -> bool:
        """NB: a probe past the budget may know only a lower bound of its device figure (its
        allocated peak, or the replay's without the GPU's limit), enough for the verdict and
        for the line through the probes; the answer's neighbour gets its figure (`answer`)."""
        if x not in self.device:
            self._run(x, verdict_only=True)
        return self.device[x] <= self.budget and x not in self.oom and x not in self.bound

    def answer(self, knob: str, value: int | None, next_value: int | None) -> Answer:
        """The answer with the device figures `memspec estimate` gives at both values."""
        if next_value is not None and next_value in self.bound:
            self._run(next_value, verdict_only=False)
        return Answer(knob, value, self.device.get(value), next_value, self.device.get(next_value), self.runs)


def _guess(good: int, d_good: int, bad: int, d_bad: int, budget: int) -> int:
    """Where the line through (good, d_good) and (bad, d_bad) meets the budget, kept strictly
    inside the bracket: peaks are close to linear in batch and sequence, so this lands next
    to the answer in a step or two."""
    if d_bad == d_good:
        return (good + bad) // 2
    x = good + (budget - d_good) * (bad - good) // (d_bad - d_good)
    return min(max(x, min(good, bad) + 1), max(good, bad) - 1)


def _narrow(probe: _Probe, good: int, bad: int) -> tuple[int, int]:
    """Shrink a bracket (good fits, bad does not) to neighbours."""
    bisect = False
    while abs(bad - good) > 1:
        if bisect:
            x = (good + bad) // 2
        else:
            x = _guess(good, probe.device[good], bad, probe.device[bad], probe.budget)
        if probe.fits(x):
            far = abs(x - good) > abs(bad - x)
            good = x
        else:
            far = abs(bad - x) > abs(x - good)
            bad = x
        # An interpolation that only nibbles at one end is followed by a bisection step.
        bisect = not bisect and not far
    return good, bad


def largest_fitting(probe: _Probe, low: int, high: int, start: int | None = None) -> tuple[int | None, int | None]:
    """(largest x in [low, high] that fits, x + 1 or None); fits must go True..True False..False.

    `start` (the setup's own value, whose figure the probe already has, or an answer near this
    one's) begins the search where the peak grows as it will near the answer: from `low` the
    first points can lie where a resident term (weights, optimizer states) still sets the
    peak, and a line through them overshoots by orders of magnitude.

    NB: the device figure is not monotone everywhere (the caching allocator's segments make
    it step down here and there; with the replay in the formulas' order alone and a 6 %
    margin, specs/experiments/llava-1.5-7b-seed-s1024-b16-dp4.yaml on an H100: seq 3388, 3728
    and 3867 fit, 3389, 3456, 3525 and 3868 do not; and in dp, qwen2.5-7b-liger-packed.yaml
    on A100-40GBs at ZeRO-2: 10 and 15 fit, 14 does not), so
    where the budget meets such a stretch the answer is the boundary this search's probes
    meet, and a search with other probes (a line through the allocated peaks, say) answers
    another one."""
    x = start if start is not None and low < start <= high else low
    if not probe.fits(x):
        if x == low or not probe.fits(low):
            return None, low
        return _narrow(probe, low, x)
    good, step = x, max(x - low, 1)
    while True:  # gallop, extrapolating along the line through the last two points
        x = min(good + step, high)
        if not probe.fits(x):
            return _narrow(probe, good, x)
        if x == high:
            return x, None
        d0, d1 = probe.device[good], probe.device[x]
        reach = (probe.budget - d1) * (x - good) // (d1 - d0) if d1 > d0 else step
        # NB: at most 4x further each time, whatever the line says (a flat stretch has no slope)
        step = min(max(2 * (x - good), reach + 1), 4 * x)
        good = x


def smallest_fitting(probe: _Probe, high: int) -> tuple[int | None, int | None]:
    """(smallest x in [1, high] that fits, x - 1 or None); fits must go False..False True..True."""
    if probe.fits(1):
        return 1, None
    bad, x = 1, 2
    while not probe.fits(x):  # gallop: 2, 4, 8, ...
        bad = x
        if x == high:
            return None, high
        x = min(2 * x, high)
    return _narrow(probe, x, bad)


def fit(spec: Spec, setup: Setup, gpu: Gpu, margin: Margin | None = None, resolve: Callable[[Mapping[str, Any]], Setup] | None = None) -> FitReport:
    """`margin`: None for the setup's (--margin), else the catalog's; `resolve`: the setup with
    more overrides (see levers.py), None for no levers."""
    margin = margin or setup.margin or gpu_catalog()[1].margin
    budget = margin.budget(gpu.memory)
    setup = replace(setup, gpu=gpu, target=gpu)
    # NB: a module whose inputs a probe leaves as they were (a vision tower at another sequence
    # length) is expanded and evaluated once for the whole search
    reuse: dict = {}
    base = run(spec, setup, reuse=reuse)
    probe_b = _Probe(spec, lambda b: replace(setup, micro_batch=b), budget, reuse=reuse)
    probe_s = _Probe(spec, lambda s: replace(setup, seq_len=s), budget, reuse=reuse)
    # NB: the image tokens at the experiment's image size (tiles, native resolution), not the
    # spec's default size: a shorter sequence cannot hold the images (E723)
    min_seq = (image_tokens_per_sample(base.nodes) or 0) + 1
    # NB: each search knows the setup as given already (the base estimate's device figure)
    probe_b.know(setup.micro_batch, base)
    probe_s.know(setup.seq_len, base)
    # NB: no more samples than the model's tower runs at once (MiniCPM-V 2.6's vision_batch_size)
    most = vision_chunk_micro_batch(spec, setup.images_per_sample, setup.image_size)
    micro = probe_b.answer("micro_batch", *largest_fitting(probe_b, 1, min(MAX_MICRO_BATCH, most or MAX_MICRO_BATCH), setup.micro_batch))
    # NB: no longer sequence than the positions the model was trained for (max_position_embeddings)
    max_seq = min(MAX_SEQ, spec.context_length) if spec.context_length else MAX_SEQ
    seq = probe_s.answer("seq_len", *largest_fitting(probe_s, min_seq, max(max_seq, min_seq), setup.seq_len))
    dp = None
    if setup.zero >= 1 or setup.fsdp is not None:  # NB: sharding makes more ranks need less memory each
        # NB: expand and evaluate do not read dp (each rank's share is the walks'): one set of layers
        probe_d = _Probe(spec, lambda d: replace(setup, dp=d), budget, base.nodes)
        probe_d.know(setup.dp, base)
        dp = probe_d.answer("dp", *smallest_fitting(probe_d, MAX_DP))
    found, at = (), None
    # NB: a margin from the catalog is the kind of step's: each lever's own
    own = margin.source.startswith("specs/gpus.yaml")
    if resolve is not None and not within(base, budget):
        at = 1 if micro.value is None else setup.micro_batch
        found = levers(spec, replace(setup, micro_batch=at), None if own else budget, resolve, reuse)
    expandable, expandable_margin = None, None
    if resolve is not None and own and setup.alloc_conf.defaults:
        expandable, expandable_margin = _expandable_answer(spec, setup, gpu, resolve, most, reuse, micro.value)
    return FitReport(gpu, margin, budget, base, micro, seq, dp, spec.context_length, most, found, at, expandable, expandable_margin)


def _expandable_answer(
    spec: Spec, setup: Setup, gpu: Gpu, resolve, most: int | None, reuse: dict, near: int | None = None
) -> tuple[Answer | None, Margin | None]:
    """The largest micro-batch under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, judged
    with the catalog's margin for it (specs/gpus.yaml device.margin_pct.expandable_segments):
    the same training, the allocator mapping pages into one growing segment per pool. `near`:
    the answer under torch's defaults, where the search begins (the two settings hold about
    as much: LLaVA-1.5-7B finetune on an H100 at dp 8 ZeRO-3, 41 and 42; 4 estimates from 41
    where 8 from the setup's 16), else at the setup's micro-batch."""
    try:
        changed = replace(resolve({"alloc_conf": EXPANDABLE_SEGMENTS, "micro_batch": setup.micro_batch}), gpu=gpu, target=gpu)
    except MemspecError:
        return None, None  # NB: a setup that refuses it has no such answer
    budget = changed.margin.budget(gpu.memory)
    probe = _Probe(spec, lambda b: replace(changed, micro_batch=b), budget, reuse=reuse)
    answer = probe.answer("micro_batch", *largest_fitting(probe, 1, min(MAX_MICRO_BATCH, most or MAX_MICRO_BATCH), near or setup.micro_batch))
    return answer, changed.margin
