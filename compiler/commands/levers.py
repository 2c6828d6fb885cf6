"""What to change when a setup does not fit: `memspec fit`'s levers.

Contract: `levers(spec, setup, budget, resolve)` tries each lever that applies to `setup`,
one at a time and alone, and returns a `Lever` per lever with the device figure it reaches
and whether that is within `budget`. `resolve(overrides)` is the setup as given with more
experiment overrides on top (the CLI's flags and files, then the lever's), resolved as
`memspec estimate` would resolve them, so that a lever is exactly the flags it names. A lever
that the setup refuses (a MemspecError from resolving or estimating it) is left out.

The order is that of what a lever costs the run:
0. expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, offered where the
   setup keeps torch's defaults): the caching
   allocator maps pages into one growing segment per pool instead of cudaMalloc'ing segments,
   so a freed block is not stranded in a segment of another size; the training is the same,
   and the verdict keeps the narrower margin measured under it (specs/gpus.yaml
   device.margin_pct.expandable_segments);
1. gradient checkpointing on every module: a second forward of each layer (compute);
2. a higher ZeRO stage (dp > 1): more collective communication per step;
3. LoRA r16 on the language model (peft's default targets, all linear layers): fewer
   trained weights, a different training recipe;
4. QLoRA: the language model's linear weights in 4-bit NF4 with double quantization
   (Dettmers et al. 2023), plus LoRA r16 where it trains: 4-bit weights cost accuracy too;
5. DeepSpeed ZeRO-3 with the optimizer and the 16-bit parameters offloaded to host memory
   (ZeRO-Infinity's CPU offload): PCIe transfers every step;
6. more GPUs: dp doubled, up to MAX_LEVER_DP, sharded by ZeRO-3 when the setup shards nothing
   (data parallelism alone copies the whole model to every GPU).
A lever with several values (ZeRO stages, dp) reports the first that fits, else the last.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ..api import Report, run
from ..errors import MemspecError
from ..pipeline.resolve import Setup, Spec

MAX_LEVER_DP = 64  # more GPUs: dp doubled up to 64 ranks (8 nodes of 8), beyond which it is a cluster question
EXPANDABLE_SEGMENTS = "expandable_segments:True"  # the PYTORCH_CUDA_ALLOC_CONF of the first lever and of fit's second answer
LORA_RANK = 16  # a common LoRA rank (LLaVA-1.5's LoRA recipe uses 128, the QLoRA paper 64)
QLORA = {"bits": 4, "quant_type": "nf4", "double_quant": True}  # BitsAndBytesConfig of the QLoRA recipe


@dataclass(frozen=True)
class Lever:
    lever: str  # what changes, in words
    change: str  # the flags that make it
    device: int  # the device figure it reaches (bytes)
    fits: bool


Candidate = tuple[str, Mapping[str, Any]]  # (flags, overrides)


def within(report: Report, budget: int) -> bool:
    """The verdict: the replay never ran out of the GPU's memory and the device figure is at
    most `budget` (the GPU's memory less the margin)."""
    return report.device <= budget and report.estimate.oom is None


def _qlora(setup: Setup) -> list[Candidate]:
    """4-bit NF4 weights for the language model; LoRA r16 on it when it trains (bitsandbytes
    weights do not train, E307)."""
    if "language" in setup.trainable and setup.lora is None:
        return [(f"--quantization 4 --quant-type nf4 --double-quant --lora-r {LORA_RANK}", {"quantization": QLORA, "lora": {"r": LORA_RANK}})]
    return [("--quantization 4 --quant-type nf4 --double-quant", {"quantization": QLORA})]


def _more_gpus(setup: Setup) -> list[Candidate]:
    """dp doubled; ZeRO-3 on top when nothing is sharded yet."""
    shard = {} if setup.zero or setup.fsdp is not None else {"zero": 3}
    flags = " --zero 3" if shard else ""
    out, dp = [], setup.dp * 2
    while dp <= MAX_LEVER_DP:
        out.append((f"--dp {dp}{flags}", {"dp": dp, **shard}))
        dp *= 2
    return out


def candidates(spec: Spec, setup: Setup) -> list[tuple[str, list[Candidate]]]:
    """The levers that apply to `setup`, in order of cost, each with its values to try."""
    every = [m.name for m in spec.modules]
    ds = setup.deepspeed
    offloaded = ds is not None and (ds.offload_optimizer != "none" or ds.offload_param != "none")
    out: list[tuple[str, list[Candidate]]] = []
    if setup.alloc_conf.defaults:
        # NB: only from torch's defaults: with other settings beside it, expandable segments
        # were never measured on a GPU
        out.append(("expandable segments", [(f"--alloc-conf {EXPANDABLE_SEGMENTS}", {"alloc_conf": EXPANDABLE_SEGMENTS})]))
    if not set(every) <= setup.gradient_checkpointing and not setup.activation_offloading:
        out.append(("gradient checkpointing, every module", [(f"--gradient-checkpointing {','.join(every)}", {"gradient_checkpointing": every})]))
    if setup.dp > 1 and setup.zero < 3 and setup.fsdp is None:
        out.append(("a higher ZeRO stage", [(f"--zero {z}", {"zero": z}) for z in range(setup.zero + 1, 4)]))
    if setup.lora is None and "language" in setup.trainable:
        out.append((f"LoRA r{LORA_RANK}, default targets", [(f"--lora-r {LORA_RANK}", {"lora": {"r": LORA_RANK}})]))
    if setup.quantization is None and "language" in {m.name for m in spec.modules}:
        out.append(("QLoRA, 4-bit nf4 weights", _qlora(setup)))
    if setup.fsdp is None and not offloaded:
        out.append(
            (
                "optimizer and parameters to CPU",
                [("--zero 3 --offload-optimizer cpu --offload-param cpu", {"zero": 3, "offload_optimizer": "cpu", "offload_param": "cpu"})],
            )
        )
    if setup.dp < MAX_LEVER_DP:
        out.append(("more GPUs", _more_gpus(setup)))
    return out


def levers(spec: Spec, setup: Setup, budget: int | None, resolve: Callable[[Mapping[str, Any]], Setup], reuse: dict | None = None) -> tuple[Lever, ...]:
    """Each lever alone on `setup` (its micro-batch and sequence), as in the module docstring.
    `budget` None: each lever's setup within the GPU's memory less its own catalog margin
    (turning checkpointing on changes the margin, specs/gpus.yaml device.margin_pct).
    `reuse`: the search's layers made so far (api.run; more GPUs or a ZeRO stage change none)."""
    out = []
    for name, tries in candidates(spec, setup):
        found = None
        for flags, change in tries:
            try:
                changed = resolve({**change, "micro_batch": setup.micro_batch, "seq_len": setup.seq_len})
                report = run(spec, replace(changed, gpu=setup.gpu, target=setup.target), table=False, reuse=reuse)
            except MemspecError:
                continue  # NB: a lever this setup refuses (activation offloading, FSDP, tp) is no lever
            found = Lever(name, flags, report.device, within(report, report.budget if budget is None else budget))
            if found.fits:
                break
        if found is not None:
            out.append(found)
    return tuple(out)
