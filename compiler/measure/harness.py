"""Build a model from its config, set up one experiment, and trace training steps.

Contract: `measure(exp, steps=...)` builds the experiment's model from its config.json (the
builder in `families/` for the config's `model_type`: LlavaForConditionalGeneration, ...;
random init, on fake tensors unless `fake=False`), applies the
experiment (trainable modules, precision, optimizer, gradient checkpointing, attention),
runs `steps` training steps under a `MemoryTracer` with the CUDA emulation of `emulation`,
and returns a `Measurement`: the peak of every step with its phase, op, module and bytes by
category. Nothing is downloaded and, on fake tensors, no tensor memory is touched.

A step is what Hugging Face's Trainer runs: `loss = model(**batch).loss` (the output object
dies at once), `loss.backward()`, the optimizer step, `zero_grad(set_to_none=True)`.
Mixed precision ("bf16-mixed", "fp16-mixed") is DeepSpeed/Megatron style: the model holds
16-bit weights and gradients; the optimizer holds fp32 master copies of the trainable
weights, created at the first step together with its states; at each step every master gets
an fp32 copy of its 16-bit gradient first, then the optimizer steps on the masters, the
masters are copied back into the 16-bit weights, and the fp32 gradients are freed. A
trainable weight without a gradient gets a zero fp32 gradient (DeepSpeed's flat partition).
With `precision_mode: autocast` ("bf16-mixed" as HF Trainer without DeepSpeed, accelerate and
Lightning run it) the model, its gradients and the optimizer's states are fp32, and the forward
runs as accelerate's Accelerator.prepare_model wraps it: `convert_outputs_to_fp32` around
`torch.autocast(dtype=bf16)` around the model's forward, so the cast cache (each trainable
weight's bf16 copy) lives until the forward returns and the output's bf16 logits get an fp32
copy. The autocast is CPU's with CUDA's op policy (`emulation.CudaAutocastPolicy`).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

from ..memory.allocator import SEGMENTS_DESCENDING, Allocator, AllocatorConfig
from ..pipeline.vocabulary import release_code
from . import device_map, emulation, fsdp, tricks
from .experiment import ExperimentError, check_measurable
from .families import family_for
from .history import Recording
from .tracer import (
    BACKWARD,
    BUFFERS,
    FORWARD,
    GRADIENTS,
    INPUTS,
    LOSS,
    MASTER_GRADIENTS,
    OPTIMIZER,
    OPTIMIZER_STATES,
    PARAMETERS,
    PHASES,
    SETUP,
    MemoryTracer,
    ModuleScope,
    Peak,
)

DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "bf16-mixed": torch.bfloat16,
    "fp16-mixed": torch.float16,
}
MIXED = ("bf16-mixed", "fp16-mixed")
# DeepSpeed fp16 `initial_scale_power` default 16 (deepspeed/runtime/fp16/loss_scaler.py).
FP16_INITIAL_LOSS_SCALE = 2.0**16
# LLaVA-1.5 finetune recipe (scripts/v1_5/finetune.sh): learning rate 2e-5, weight decay 0.
LEARNING_RATE = 2e-5
WEIGHT_DECAY = 0.0
ADAM_BETAS = (0.9, 0.999)
MIN_STEPS = 2

# transformers' attention implementation for each experiment value. flash_attention_2 needs
# the flash-attn package and a GPU; its memory equals SDPA's flash kernel (both save q, k,
# v, out and the fp32 logsumexp and allocate the same backward accumulators), so it runs as
# SDPA routed to flash.
ATTN_IMPLEMENTATION = {"sdpa": "sdpa", "eager": "eager", "flash_attention_2": "sdpa"}
# transformers 5 names a model's dtype `dtype`; 4.x `torch_dtype` (an experiment's versions.transformers)
DTYPE_KWARG = "dtype" if release_code(transformers.__version__) >= 5_000_000 else "torch_dtype"
FA2_AS_SDPA = "flash_attention_2-measured-as-sdpa-flash"


@dataclass(frozen=True)
class StepPeak:
    step: int
    allocated: int
    traced: int
    phase: str
    op: str
    module: str
    breakdown: dict[str, int]
    phases: dict[str, dict]


@dataclass(frozen=True)
class Measurement:
    steps: tuple[StepPeak, ...]
    emulation: tuple[str, ...]
    inventory: str
    timeline: list[dict] = field(default_factory=list)
    # The caching allocator's replay of every storage (compiler.memory.allocator): its
    # highest reserved and allocated (block sizes, an unsplit remainder included) over the run
    reserved: int | None = None
    allocator_allocated: int | None = None
    # device_map: each GPU's highest allocated per step (step -> GPU -> bytes); the steps above
    # are then of all GPUs together, and `reserved` is the largest GPU's
    devices: dict | None = None
    # device_map: each GPU's highest reserved over the run, its own allocator's (GPU -> bytes)
    device_reserved: dict | None = None
    # measure(history=True): what the allocator model was asked, as a GPU's allocator history
    # (measure.history.Recording; with device_map, GPU 0's)
    history: list | None = None


def load_config(config_path: Path):
    """The transformers config of the experiment's model family, KV cache off."""
    return family_for(config_path).load_config(config_path)


def config_sha256(config_path: Path) -> str:
    return hashlib.sha256(Path(config_path).read_bytes()).hexdigest()


def _fsdp(exp: dict) -> dict | None:
    return exp["parallel"].get("fsdp")


def autocast(exp: dict) -> bool:
    return exp.get("precision_mode") == "autocast"


def weight_dtype(exp: dict) -> torch.dtype:
    """The dtype the model is built in: fp32 under autocast (the model as from_pretrained loads
    it), the shards' under FSDP2, else the precision's."""
    if autocast(exp):
        return torch.float32
    return fsdp.storage_dtype(exp["precision"]) if _fsdp(exp) else DTYPES[exp["precision"]]


def wrap_forward_as_accelerate(model, dtype: torch.dtype, device_type: str = "cpu") -> None:
    """model.forward as accelerate's Accelerator.prepare_model makes it under native AMP:
    convert_outputs_to_fp32(autocast(forward)) (accelerate/accelerator.py), the autocast of
    the device the model runs on: CPU's for the trace, whose op policy
    `emulation.CudaAutocastPolicy` makes CUDA's, and CUDA's itself on a GPU (an autocast of
    another device type leaves the forward in fp32)."""
    from types import MethodType

    from accelerate.utils import convert_outputs_to_fp32

    forward = model.forward.__func__

    def autocast_forward(*args, **kwargs):
        with torch.autocast(device_type=device_type, dtype=dtype):
            return forward(*args, **kwargs)

    model.forward = MethodType(convert_outputs_to_fp32(autocast_forward), model)


def build_model(config, exp: dict):
    family = family_for(exp["config"])
    # NB: under FSDP2 the model keeps its full-precision weights (sharded); the policy's
    # param_dtype copies are what the layers compute with
    dtype = weight_dtype(exp)
    try:
        model = family.model_class()._from_config(config, attn_implementation=ATTN_IMPLEMENTATION[exp["attention"]], **{DTYPE_KWARG: dtype})
    except ValueError as error:
        if "attention implementation" not in str(error):
            raise
        # NB: transformers refuses a kernel the architecture does not support (Gemma 2: no sdpa)
        raise ExperimentError(
            f"experiment {exp['experiment']!r}: transformers does not build {family.model_class().__name__} "
            f"with attention {exp['attention']!r} ({str(error).splitlines()[0][:160]})"
        ) from None
    model.train()
    model.requires_grad_(False)
    groups = family.module_groups(model)
    for name in exp["trainable"]:
        for module in groups[name]:
            module.requires_grad_(True)
    for name in exp["gradient_checkpointing"]:
        # Transformers' default: non-reentrant torch.utils.checkpoint per decoder/encoder layer.
        pick = getattr(family, "checkpoint_module", None)
        module = pick(model, name) if pick else groups[name][0]
        enable = getattr(module, "activation_checkpointing_enable", None) or module.gradient_checkpointing_enable
        enable({"use_reentrant": False})
    if exp.get("device_map"):
        # NB: from_pretrained places the model before peft wraps it
        model._memspec_device_map = device_map.plan(model, exp)
    if exp.get("lora"):
        placed = getattr(model, "_memspec_device_map", None)
        model = apply_lora(model, exp, groups)
        if placed is not None:
            model._memspec_device_map = placed
    return model


def lora_targets(model, lora: dict, groups: dict) -> list[str]:
    """Full names of the linear layers peft would adapt, within the experiment's LoRA modules.

    peft matches a module whose name equals a target or ends with `.<target>`
    (tuners_utils.check_target_module_exists); `all-linear` is every nn.Linear but the output
    embedding (`_maybe_include_all_linear_layers`). NB: peft itself matches over the whole
    model, so `q_proj` would also adapt CLIP's q_proj; LLaVA's recipes adapt the language
    model only (train.py `find_all_linear_names` skips the vision tower and projector), so
    the targets are restricted to `lora.modules` and passed to peft as full names.
    """
    inside = {id(m) for name in lora["modules"] for g in groups[name] for m in g.modules()}
    output = model.get_output_embeddings()
    names = []
    for name, module in model.named_modules():
        if id(module) not in inside or not isinstance(module, torch.nn.Linear):
            continue
        if lora["target_modules"] == "all-linear":
            hit = module is not output
        else:
            hit = any(name == t or name.endswith("." + t) for t in lora["target_modules"])
        if hit:
            names.append(name)
    return names


def apply_lora(model, exp: dict, groups: dict):
    """peft's `get_peft_model` with the experiment's LoraConfig; trainable modules train again.

    NB: `autocast_adapter_dtype=False` keeps LoRA A/B in the base weight's dtype, as LLaVA's
    train.py (`model.to(torch.bfloat16)` before get_peft_model) and DeepSpeed's bf16 engine
    (the whole module cast to bf16) leave them; peft's default would upcast them to fp32.
    With gradient checkpointing on, peft calls `enable_input_require_grads()`
    (PeftModel._prepare_model_for_gradient_checkpointing).
    """
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import ModulesToSaveWrapper

    lora = exp["lora"]
    config = LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora_targets(model, lora, groups),
        bias=lora["bias"],
        modules_to_save=lora["modules_to_save"] or None,
        use_dora=lora.get("use_dora", False),
    )
    # NB: adapters are created in the base dtype (the default dtype while peft builds them)
    # on the base device, which is where peft then moves them (`_replace_module`,
    # `_move_adapter_to_device_of_base_layer`); `Module.to()` cannot swap a fake parameter
    # ("Cannot swap t1 because it has weakref"), so those moves are made no-ops.
    default, to, deepcopy = torch.get_default_dtype(), torch.nn.Module.to, copy.deepcopy
    torch.set_default_dtype(weight_dtype(exp))
    torch.nn.Module.to = lambda self, *args, **kwargs: self
    copy.deepcopy = _same_mode_deepcopy(deepcopy)
    try:
        peft_model = get_peft_model(model, config, autocast_adapter_dtype=False)
    finally:
        torch.set_default_dtype(default)
        torch.nn.Module.to = to
        copy.deepcopy = deepcopy
    _check_modules_to_save(peft_model, lora["modules_to_save"])
    # NB: peft freezes every non-adapter parameter; LLaVA builds its projector after
    # get_peft_model, so a fully trained module keeps requires_grad. A module that
    # modules_to_save wrapped keeps peft's state (original frozen, copy trained).
    originals = {id(p) for m in peft_model.modules() if isinstance(m, ModulesToSaveWrapper) for p in m.original_module.parameters()}
    for name in exp["trainable"]:
        if name not in lora["modules"]:
            for module in groups[name]:
                # NB: a group may name a bare parameter (LLaVA-NeXT's image_newline)
                for p in module.parameters() if isinstance(module, torch.nn.Module) else (module,):
                    if id(p) not in originals:
                        p.requires_grad_(True)
    return peft_model


def _same_mode_deepcopy(deepcopy):
    """copy.deepcopy for peft's ModulesToSaveWrapper.update: each parameter and buffer of a
    module is cloned first, so that the copy's fake tensors belong to the fake mode the model
    was built in (deepcopy of a FakeTensor makes one in a new mode, which the forward then
    refuses to mix). Real tensors copy the same way: a new storage per tensor."""

    def copy_module(obj, memo=None):
        if not isinstance(obj, torch.nn.Module):
            return deepcopy(obj, memo)
        memo = {} if memo is None else memo
        for p in obj.parameters():
            memo.setdefault(id(p), torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))
        for b in obj.buffers():
            memo.setdefault(id(b), b.clone())
        return deepcopy(obj, memo)

    return copy_module


def _check_modules_to_save(peft_model, names: list[str]) -> None:
    """peft silently ignores a modules_to_save name that matches nothing (_set_trainable
    without strict_module_check); a measurement of such an experiment would not be what it
    says, so it is refused."""
    from peft.utils.other import ModulesToSaveWrapper

    wrapped = [n for n, m in peft_model.named_modules() if isinstance(m, ModulesToSaveWrapper)]
    missing = [t for t in names if not any(n.endswith(t) for n in wrapped)]
    if missing:
        raise ValueError(f"lora.modules_to_save {missing} matched no module of the model")


def make_batch(config, exp: dict) -> dict[str, torch.Tensor]:
    # NB: under autocast the pixel values come as the processor makes them, fp32
    return family_for(exp["config"]).make_batch(config, exp, torch.float32 if autocast(exp) else DTYPES[exp["precision"]])


def trainer_param_groups(model, trainable: list[torch.Tensor]) -> list[list[int]]:
    """Hugging Face Trainer's two parameter groups, as indices into `trainable`
    (transformers/trainer.py, Trainer.create_optimizer): the parameters
    Trainer.get_decay_parameter_names lists, then the others, each in named_parameters()
    order. get_decay_parameter_names is transformers' own (it reads no Trainer state)."""
    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))
    index = {id(p): i for i, p in enumerate(trainable)}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [[index[id(p)] for n, p in named if n in decay], [index[id(p)] for n, p in named if n not in decay]]


def make_torch_optimizer(params: list[torch.Tensor], spec: dict, groups: list[list[int]] | None = None) -> torch.optim.Optimizer:
    """AdamW, Adam, SGD (torch, the implementation flag passed explicitly) or transformers'
    Adafactor as Trainer builds it (scale_parameter=False, relative_step=False,
    trainer_optimizer.py _get_adafactor; beta1 = the experiment's momentum, None at 0).
    With `groups` (indices into `params`), the Trainer's parameter groups: the first with
    the weight decay, the second with none (Trainer.create_optimizer).

    NB: `_default_to_fused_or_foreach` rejects fake tensors and would pick the for-loop
    implementation; CUDA's default is foreach.
    """
    impl = spec.get("impl", "foreach")
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    decay = spec.get("weight_decay", WEIGHT_DECAY)
    if groups is not None:
        params = [{"params": [params[i] for i in groups[0]], "weight_decay": decay}, {"params": [params[i] for i in groups[1]], "weight_decay": 0.0}]
    if spec["type"] == "adamw":
        return torch.optim.AdamW(params, lr=LEARNING_RATE, betas=ADAM_BETAS, weight_decay=decay, **flags)
    if spec["type"] == "adam":
        return torch.optim.Adam(params, lr=LEARNING_RATE, betas=ADAM_BETAS, weight_decay=decay, **flags)
    if spec["type"] == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=LEARNING_RATE, scale_parameter=False, relative_step=False, beta1=spec.get("momentum") or None, weight_decay=decay)
    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=spec.get("momentum", 0.0), weight_decay=decay, **flags)


class MasterWeightOptimizer:
    """fp32 master weights around a torch optimizer (DeepSpeed bf16/fp16, Megatron)."""

    def __init__(self, params: list[torch.Tensor], spec: dict, tracer: MemoryTracer, loss_scale: float, groups: list[list[int]] | None = None) -> None:
        self.params = params
        self.spec = spec
        self.groups = groups
        self.tracer = tracer
        self.loss_scale = loss_scale
        self.masters: list[torch.Tensor] | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    @torch.no_grad()
    def step(self) -> None:
        if self.masters is None:
            self.masters = [p.detach().to(torch.float32, copy=True) for p in self.params]
            self.tracer.relabel(self.masters, OPTIMIZER_STATES)
            self.optimizer = make_torch_optimizer(self.masters, self.spec, self.groups)
        for master, p in zip(self.masters, self.params):
            # NB: a trainable weight the loss never reaches (CLIP's last layer and
            # post-layernorm: LLaVA reads layer -2) has no gradient; DeepSpeed's flat fp32
            # gradient partition holds zeros for it, so it still gets Adam states.
            master.grad = p.grad.float() if p.grad is not None else torch.zeros_like(master)
        self.tracer.relabel([m.grad for m in self.masters], MASTER_GRADIENTS)
        if self.loss_scale != 1.0:
            torch._foreach_mul_([m.grad for m in self.masters], 1.0 / self.loss_scale)
        self.optimizer.step()
        for master, p in zip(self.masters, self.params):
            p.copy_(master)
        for master in self.masters:
            master.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def state_tensors(self) -> list[torch.Tensor]:
        return list(self.masters or []) + optimizer_state_tensors(self.optimizer)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


class PlainOptimizer:
    """A torch optimizer straight on the model's parameters (fp32, pure bf16)."""

    def __init__(self, params: list[torch.Tensor], spec: dict, groups: list[list[int]] | None = None) -> None:
        self.optimizer = make_torch_optimizer(params, spec, groups)

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_tensors(self) -> list[torch.Tensor]:
        return optimizer_state_tensors(self.optimizer)


def _host_ops() -> frozenset:
    # torch.tensor(python_scalar) makes a host tensor on a CUDA machine (e.g. AdamW's
    # per-parameter `step` counters and the `torch.tensor(1.0)` it adds to them).
    return frozenset({torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default})


def _step_peak(tracer: MemoryTracer, step: int) -> StepPeak:
    peak = tracer.step_peak(step)
    phases = {}
    for phase in PHASES:
        p: Peak | None = tracer.peaks.get((step, phase))
        if p is not None:
            phases[phase] = {"allocated": p.allocated, "op": p.op, "module": p.module, "breakdown": p.breakdown()}
            if tracer.watched.get((step, phase)):
                phases[phase]["modules"] = dict(tracer.watched[(step, phase)])
    return StepPeak(
        step=step, allocated=peak.allocated, traced=peak.traced, phase=peak.phase, op=peak.op, module=peak.module, breakdown=peak.breakdown(), phases=phases
    )


def format_inventory(rows: list[tuple[str, str, int, int]], title: str) -> str:
    total = sum(r[3] for r in rows)
    lines = [title, f"{'bytes':>16}  {'count':>5}  module / dtype[shape] op", f"{total:>16}  {'':>5}  total"]
    lines += [f"{nbytes:>16}  {count:>5}  {module or '<root>'}  {what}" for module, what, count, nbytes in rows]
    return "\n".join(lines) + "\n"


def _make_optimizer(exp: dict, model, trainable: list[torch.Tensor], tracer: MemoryTracer):
    groups = trainer_param_groups(model, trainable) if exp["optimizer"].get("param_groups") == "trainer" else None
    # NB: FSDP2's sharded parameters are the full-precision weights the optimizer steps
    if exp["precision"] in MIXED and not _fsdp(exp) and not autocast(exp):
        scale = FP16_INITIAL_LOSS_SCALE if exp["precision"] == "fp16-mixed" else 1.0
        return MasterWeightOptimizer(trainable, exp["optimizer"], tracer, scale, groups), scale
    return PlainOptimizer(trainable, exp["optimizer"], groups), 1.0


def _emulation_names(applied: list[str], exp: dict, fake: bool) -> tuple[str, ...]:
    names = list(applied)
    if fake:
        names += [emulation.LAYER_NORM_STATS_FP32, emulation.INPUT_BUFFER_IN_PLACE]
    if exp["attention"] == "flash_attention_2":
        names.append(FA2_AS_SDPA)
    if autocast(exp):
        names.append(emulation.AUTOCAST_CUDA_POLICY)
    return tuple(
        names
        + [
            emulation.STEP_ON_HOST,
            emulation.FLASH_BACKWARD_SCRATCH,
            emulation.CUDNN_BACKWARD_SCRATCH,
            emulation.MASKED_SCATTER_SCRATCH,
            emulation.MASKED_SCATTER_MASK,
            emulation.DROPOUT_MASK_FIRST,
            emulation.MASKED_SELECT_SCRATCH,
            emulation.CUBLAS_WORKSPACE,
            emulation.SOFTMAX_BACKWARD_SCRATCH,
            SEGMENTS_DESCENDING,
        ]
        # NB: a model split by device_map makes each GPU's workspaces at its threads' first GEMMs
        # as well, and builds no untied head in the replay (`_tracer`)
        + [emulation.WORKSPACE_AT_FIRST_GEMM]
        + ([] if exp.get("device_map") else [emulation.TIED_HEAD_AT_BUILD])
    )


def _train_step(
    step: int, model, batch: dict, optimizer, scale: float, tracer: MemoryTracer, scope: ModuleScope, emulate: bool, after_forward=None, offload: bool = False
) -> None:
    """One Trainer step, telling the tracer and the module scope where it is."""
    tracer.step = step
    scope.reset_calls()
    tracer.phase, scope.label = FORWARD, ""
    if emulate:
        tracer.persistent = emulation.persistent_scratch(1 if step == 1 else 2)
        tracer.workspaces(emulation.allocate_workspaces, 1 if step == 1 else 2)
    with tricks.offloaded() if offload else _nothing():
        loss = model(**batch).loss  # the output object (logits) dies here
    scope.unmark()
    if after_forward is not None:
        after_forward()
    tracer.phase, scope.in_backward = BACKWARD, True
    if emulate:
        tracer.persistent = emulation.persistent_scratch(2)
        tracer.workspaces(emulation.allocate_workspaces, 2)
    (loss * scale if scale != 1.0 else loss).backward()
    del loss
    scope.in_backward = False
    tracer.phase, scope.label = OPTIMIZER, "optimizer"
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracer.relabel(optimizer.state_tensors(), OPTIMIZER_STATES)
    tracer.phase, scope.label = SETUP, ""


def measure(
    exp: dict,
    *,
    steps: int = 3,
    fake: bool = True,
    timeline: bool = False,
    emulate: bool = True,
    skip: frozenset = frozenset(),
    granularity: int | None = None,
    history: bool = False,
) -> Measurement:
    """Trace `steps` training steps of `exp`; see the module docstring.

    `fake=False` runs on real CPU tensors; `emulate=False` turns the CUDA emulation off and
    `skip` leaves out single behaviours (both for tests); `granularity` overrides the
    allocator rounding (1 counts exact bytes). `history`: keep the allocator model's
    sequence (Measurement.history; with the emulation only).
    """
    check_measurable(exp)
    if steps < MIN_STEPS:
        raise ValueError(f"at least {MIN_STEPS} steps: step 1 creates the optimizer states")
    fake_mode, model, batch, host_values = _model_and_batch(exp, fake)

    if autocast(exp):
        wrap_forward_as_accelerate(model, DTYPES[exp["precision"]])
    scope = ModuleScope(model)
    split = getattr(model, "_memspec_device_map", None)
    tracer = _tracer(
        model, batch, scope, emulate=emulate, timeline=timeline, granularity=granularity, split=split, alloc_conf=exp.get("alloc_conf"), history=history
    )
    undo = device_map.install(split[0], split[2], tracer) if split is not None else None
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.register_post_accumulate_grad_hook(lambda p: tracer.relabel([p.grad], GRADIENTS))
    optimizer, scale = _make_optimizer(exp, model, trainable, tracer)
    fused = _hook_loss(exp, model, tracer, scope)
    if exp.get("packing"):
        # NB: a packed batch must reach transformers' packed-sequence mask (on fake tensors
        # find_packed_sequence_indices always reports packing, which a packed batch is)
        skip = skip | {emulation.NO_PACKED_SEQUENCE_MASK}

    behaviour = emulation.cuda_behaviour(fake=fake, skip=skip, host_values=bool(host_values)) if emulate else _nothing([])
    fake_ops = emulation.FakeOpsAsCuda() if emulate and fake else _nothing()
    policy = emulation.CudaAutocastPolicy() if autocast(exp) else _nothing()
    inventory = []

    def take_inventory() -> None:
        inventory.append(format_inventory(tracer.inventory(), f"live activations at the end of forward, step {steps}"))

    family_patches = getattr(family_for(exp["config"]), "host_patches", None)
    patches = family_patches() if emulate and family_patches else _nothing([])
    with fake_mode or _nothing(), behaviour as applied, patches as patched, fake_ops, policy, tracer:
        for step in range(1, steps + 1):
            _train_step(
                step,
                model,
                batch,
                optimizer,
                scale,
                tracer,
                scope,
                emulate,
                after_forward=take_inventory if step == steps else None,
                offload=bool(exp.get("activation_offloading")),
            )
    scope.remove()
    if undo is not None:
        undo()
    tricks_applied = ([tricks.FUSED_LOSS] if fused else []) + ([tricks.OFFLOAD_HOST_AS_META] if exp.get("activation_offloading") else [])
    return Measurement(
        steps=tuple(_step_peak(tracer, s) for s in range(1, steps + 1)),
        emulation=_emulation_names(applied + patched + tricks_applied, exp, fake) if emulate else (),
        inventory=inventory[0],
        timeline=tracer.timeline,
        reserved=tracer.peak_reserved,
        allocator_allocated=tracer.allocator.peak_allocated if tracer.allocator is not None and split is None else None,
        devices=tracer.device_peaks if split is not None else None,
        device_reserved=({gpu: a.peak_reserved for gpu, a in tracer.allocators.items()} if split is not None and tracer.allocators is not None else None),
        history=getattr(tracer.allocator if tracer.allocators is None else tracer.allocators.get(0), "history", None),
    )


def _hook_loss(exp: dict, model, tracer, scope: ModuleScope) -> bool:
    """The loss phase begins when lm_head's forward returns, or where the fused loss starts
    (Liger's fused linear cross-entropy, which runs lm_head inside it); whether it is fused."""

    def enter_loss(module, args, output):
        if tracer.phase == FORWARD:
            tracer.phase = LOSS
            scope.mark("loss")

    # NB: BLIP-2's head is its language model's (language_model.lm_head)
    head = model.lm_head if hasattr(model, "lm_head") else model.get_output_embeddings()
    head.register_forward_hook(enter_loss)
    fused = exp.get("loss") == "fused_linear_cross_entropy"
    if fused:
        _check_fused_loss(exp)
        tricks.install_fused_loss(model, lambda: enter_loss(None, None, None))
    return fused


def _model_and_batch(exp: dict, fake: bool):
    """(the fake tensor mode or None, the model built and sharded under it, the batch, the
    batch keys whose values the model reads on the host)."""
    config = load_config(exp["config"])
    fake_mode = None
    device_mesh = fsdp.mesh(exp["parallel"]["dp"]) if _fsdp(exp) else None
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode()
    with fake_mode or _nothing():
        model = build_model(config, exp)
        if device_mesh is not None:
            fsdp.shard(model, exp, device_mesh)
    # NB: the batch is built from real tensors and then faked, so that the values the model
    # reads on the host (the family's HOST_VALUES) survive as constants.
    batch = make_batch(config, exp)
    host_values = frozenset(getattr(family_for(exp["config"]), "HOST_VALUES", ()))
    if fake_mode is not None:
        batch = {k: (_fake_input(fake_mode, v, k in host_values) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    return fake_mode, model, batch, host_values


def _tracer(
    model,
    batch: dict,
    scope: ModuleScope,
    *,
    emulate: bool,
    timeline: bool,
    granularity: int | None,
    split: tuple | None = None,
    alloc_conf: str | None = None,
    history: bool = False,
) -> MemoryTracer:
    """The tracer of one measurement, the model's parameters, buffers and the batch registered;
    with `split` (device_map.plan's), each on its GPU (the batch on GPU 0). `alloc_conf`: the
    PYTORCH_CUDA_ALLOC_CONF the emulated allocator replays the step under; `history`: the
    allocator keeps its sequence (measure.history.Recording)."""
    allocator = (Recording if history else Allocator)(AllocatorConfig.parse(alloc_conf or "")) if emulate else None
    tracer = MemoryTracer(
        context=scope.context,
        scratch=emulation.kernel_scratch if emulate else None,
        made_order=emulation.made_order if emulate else None,
        host_ops=_host_ops() if emulate else frozenset(),
        device="cpu",
        timeline=timeline,
        # NB: the token embeddings' moment in backward: after the vision tower's backward in
        # a multimodal model (autograd runs later-created nodes first), never a phase peak
        # of its own in some setups; the estimate's timeline is checked against it
        watch=_input_embeddings(model, scope),
        **({"granularity": granularity} if granularity else {}),
        allocator=allocator,
    )
    if emulate:
        tracer.make_workspace = emulation.allocate_workspace
    if history and allocator is not None:
        allocator.describe = tracer.describe
    if split is None:
        tracer.register(model.parameters(), PARAMETERS)
        tracer.register(model.buffers(), BUFFERS)
        _untied_head(model, tracer.allocator)
        tracer.register([v for v in batch.values() if isinstance(v, torch.Tensor)], INPUTS)
        return tracer
    gpus = device_map.module_gpus(model, split[1])
    by_path = {path: gpus[id(m)] for m, path in scope.names.items()}
    head = next((by_path[p] for p in by_path if p.endswith("lm_head")), 0)
    tracer.track_devices(lambda module: by_path.get(module, head if module == "loss" else 0))
    for module in model.modules():
        gpu = gpus[id(module)]
        tracer.register(module.parameters(recurse=False), PARAMETERS, device=lambda t, g=gpu: g)
        tracer.register(module.buffers(recurse=False), BUFFERS, device=lambda t, g=gpu: g)
    tracer.register([v for v in batch.values() if isinstance(v, torch.Tensor)], INPUTS, device=lambda t: 0)
    return tracer


def _untied_head(model, allocator) -> None:
    """The output embedding's own weight, made and dropped while the model is built: with
    tied embeddings, `PreTrainedModel.__init__` builds `lm_head` (its nn.Linear allocates a
    [vocab, hidden] weight on the device) and `post_init` -> `tie_weights` then points it at
    the input embedding's, which frees it. The caching allocator keeps the freed segment, so
    the steps find one more block of that size cached (a GPU's allocator history shows the
    allocation and the free one after the other, after the last layer's weights). Allocated
    is unchanged; the replay's segments are not."""
    if allocator is None:
        return
    try:
        head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return
    weight = getattr(head, "weight", None)
    if weight is None or embeddings is None or weight is not getattr(embeddings, "weight", None):
        return
    key = ("untied output embedding",)
    allocator.malloc(key, weight.numel() * weight.element_size())
    allocator.free(key)


def _input_embeddings(model, scope: ModuleScope) -> frozenset:
    """The path of the model's token embeddings (PreTrainedModel.get_input_embeddings)."""
    try:
        module = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return frozenset()
    return frozenset({scope.names[module]}) if module in scope.names else frozenset()


def _check_fused_loss(exp: dict) -> None:
    """The fused loss stands in for Liger's text-only causal-LM forward only."""
    from .experiment import ExperimentError
    from .families import causal_lm

    if family_for(exp["config"]).make_batch is not causal_lm.make_batch:
        raise ExperimentError(
            f"experiment {exp['experiment']!r}: loss fused_linear_cross_entropy is measured for text-only causal language models (…ForCausalLM) only"
        )


def _fake_input(fake_mode, tensor: torch.Tensor, host_value: bool) -> torch.Tensor:
    """A batch tensor as a fake tensor; with `host_value`, one that keeps its values.

    NB: a fake tensor with a `constant` lets FakeTensorMode run ops whose fake inputs all
    carry constants on those constants, so `.tolist()` of token types or image grids works
    as it does on a real GPU tensor (a host sync). The output is still a fake tensor, so the
    tracer counts it like any other.
    """
    if not host_value:
        return fake_mode.from_tensor(tensor)
    return fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, tensor, make_constant=True)


class _nothing:
    """A context manager that does nothing and yields `value`."""

    def __init__(self, value=None) -> None:
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc) -> None:
        return None
