"""The setup's vocabulary: what `resolve` makes and every later stage reads.

Contract: the frozen values of one estimate (`Spec` and its `Module`s, `Setup` with its
`Optimizer`, `Lora`, `Quantization`, `Fsdp`, `DeviceMap`, and the `DeepSpeed` of
zero_config.py and `Gpu` and `Margin` of gpus.py), the tables that name the choices
(precisions and how a mixed one is realized, attention kernels, losses, the experiment
defaults), the transformers releases and the byte sizes a precision and optimizer derive
(`derive_bytes`). The GPU catalog (specs/gpus.yaml) is `gpus.py`'s, DeepSpeed's buffer sizes
`zero_config.py`'s. Nothing here reads an experiment: `resolve.resolve_setup` does, and
builds these.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..library.formula import Expr
from .load import Document
from ..memory.allocator import AllocatorConfig
from ..memory import optimizers
from ..memory.optimizers import Optimizer
from .gpus import Gpu, Margin
from .zero_config import DeepSpeed

# Element sizes of the fixed dtypes formulas may name (bytes.fp32, bytes.int64, bytes.bool).
FIXED_DTYPE_BYTES = {"fp32": 4, "int64": 8, "bool": 1}
FP32_BYTES = FIXED_DTYPE_BYTES["fp32"]

# precision -> (weights, gradients, activations, fp32 master copy per trainable parameter),
# for the DeepSpeed / Megatron form of mixed precision: 16-bit weights, gradients and
# activations, with fp32 master weights inside the optimizer (DOMAIN.md, model states).
PRECISIONS: Mapping[str, tuple[int, int, int, int]] = {
    "fp32": (4, 4, 4, 0),
    "bf16": (2, 2, 2, 0),
    "fp16": (2, 2, 2, 0),
    "bf16-mixed": (2, 2, 2, 4),
    "fp16-mixed": (2, 2, 2, 4),
}
# Lightning's precision names (lightning/fabric/plugins/precision/utils.py _PRECISION_INPUT:
# "32-true", "32", "16-mixed", "bf16-mixed", "16-true", "bf16-true") and memspec's older ones,
# each to the PRECISIONS key it is sized by. NB: "16-mixed" / "bf16-mixed" name one dtype and
# two realizations (PRECISION_MODES); the key alone does not say which.
PRECISION_NAMES: Mapping[str, str] = {
    "32-true": "fp32",
    "32": "fp32",
    "fp32": "fp32",
    "bf16-true": "bf16",
    "bf16": "bf16",
    "16-true": "fp16",
    "bf16-mixed": "bf16-mixed",
    "16-mixed": "fp16-mixed",
    "fp16-mixed": "fp16-mixed",
}
# How a precision is realized in the step:
# - "fp32": fp32 everything;
# - "pure": 16-bit weights, gradients and optimizer states (Lightning's "bf16-true", the torch
#   optimizer on a model loaded in bf16);
# - "master-weights": 16-bit weights, gradients and activations, fp32 master weights and states
#   in the optimizer: DeepSpeed's bf16 / fp16 optimizers and Megatron's, so "bf16-mixed" under
#   Lightning's DeepSpeedStrategy and HF Trainer's --bf16 with --deepspeed;
# - "autocast": fp32 weights, gradients and optimizer states, the forward under
#   torch.autocast(dtype=bf16/fp16): matmuls in 16-bit on per-forward 16-bit copies of the
#   weights, norms, softmax and the loss in fp32 (Lightning's "bf16-mixed" without DeepSpeed,
#   HF Trainer's --bf16 on a model loaded in fp32, accelerate's mixed_precision: bf16);
# - "fsdp-policy": FSDP2's MixedPrecisionPolicy: fp32 shards, 16-bit gathered weights.
PRECISION_MODES: Mapping[str, str] = {
    "fp32": "fp32 weights, gradients and optimizer states",
    "pure": "16-bit weights, gradients and optimizer states",
    "master-weights": "16-bit weights and gradients, fp32 master weights and optimizer states (DeepSpeed / Megatron)",
    "autocast": "fp32 weights, gradients and optimizer states, forward under torch.autocast (16-bit matmuls)",
    "fsdp-policy": "fp32 shards, 16-bit gathered weights (FSDP2 MixedPrecisionPolicy)",
}
MIXED_PRECISIONS = frozenset({"bf16-mixed", "fp16-mixed"})
ATTENTION = ("flash_attention_2", "sdpa", "eager")
# The causal-LM loss: transformers' ForCausalLMLoss (full fp32 logits), or Liger's fused
# linear cross-entropy (TrainingArguments(use_liger_kernel=True)): logits one chunk at a time.
LOSSES = ("cross_entropy", "fused_linear_cross_entropy")
DEFAULTS: Mapping[str, Any] = {
    "images_per_sample": 1,
    "videos_per_sample": 0,
    "precision": "bf16-mixed",
    "optimizer": {"type": "adamw", "impl": "foreach"},
    "gradient_checkpointing": [],
    "attention": "sdpa",
    "parallel": {"dp": 1, "zero": 0, "tp": 1, "pp": 1, "sp": False},
    "loss": "cross_entropy",
    "activation_offloading": False,
    "packing": False,
    "alloc_conf": "",
}
# Names a spec's module context (batch, seq) may use besides the module's own inputs.
EXPERIMENT_NAMES = frozenset(
    {"micro_batch", "seq_len", "target_len", "images_per_sample", "image_h", "image_w", "grid_rows", "grid_cols", "videos_per_sample", "video_frames"}
)
SGD_DEFAULT_MOMENTUM = 0.9


# The transformers release the formulas are measured on (pyproject.toml's measure extra); an
# experiment's `versions: {transformers: X}` names the release a job runs instead. In a
# formula, `transformers` is a release as one integer, major * 1_000_000 + minor * 1_000 +
# patch (4.46.3 is 4_046_003).
TRANSFORMERS_RELEASE = "5.23.0"
# Releases before this one run under the `older_transformers` setup: a formula lists it once
# its figures follow those releases (4.49 is the first whose ForCausalLMLoss pads the labels
# instead of copying the shifted logits, as the pinned release does).
OLDER_TRANSFORMERS = 4_049_000
# Older releases no formula models, each band (first, end, why): before 4.43 the Llama-style
# attention makes its own cos and sin per layer (4.37: slices of per-layer caches, indexed by
# position_ids; 4.38 to 4.42: computed in each layer), where 4.43 on makes them once per
# forward (LlamaModel.rotary_emb) as the pinned release does.
UNMODELLED_TRANSFORMERS: tuple[tuple[int, int, str], ...] = (
    (
        0,
        4_043_000,
        "releases before 4.43 make the rotary cos and sin in every attention layer, which the formulas do not model "
        "(measured: 4.44.2, 4.46.3, 4.57.1 and 5.23.0)",
    ),
)


def release_code(text: str) -> int | None:
    """A release such as "4.46.3" (or "4.46", patch 0; a suffix such as ".dev0" or "rc1" after the
    patch is ignored) as major * 1_000_000 + minor * 1_000 + patch; None when `text` is none."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[A-Za-z][A-Za-z0-9.+-]*)?", text.strip())
    if m is None or int(m[2]) >= 1000 or int(m[3] or 0) >= 1000:
        return None
    return int(m[1]) * 1_000_000 + int(m[2]) * 1_000 + int(m[3] or 0)


def release_text(code: int) -> str:
    return f"{code // 1_000_000}.{code // 1_000 % 1_000}.{code % 1_000}"


TRANSFORMERS = release_code(TRANSFORMERS_RELEASE)


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class DeviceMap:
    """A model split across the GPUs of one process (naive model parallelism) as
    `from_pretrained(device_map=..., max_memory=...)` places it (transformers'
    integrations/accelerate.py, after accelerate's infer_auto_device_map).

    `strategy` is "auto", "balanced", "balanced_low_0" or "sequential", or "" for an explicit
    map (`explicit`: module name -> GPU index); `max_memory` is GPU index -> bytes; `gpus` the
    GPUs of the process. `where` locates each key for errors found once the model's modules
    are known: key -> (file, line, col, path). `gpu` is the GPU one simulated walk is of and
    `placement` the device of each layer (instance path -> GPU), set by the simulation."""

    strategy: str
    explicit: tuple[tuple[str, int], ...]
    max_memory: tuple[tuple[int, int], ...]
    gpus: int
    where: tuple[tuple[str, tuple[str, int, int, str]], ...] = ()
    gpu: int = -1
    placement: tuple[tuple[str, int], ...] = ()
    trains: bool = False  # something trains somewhere: every GPU runs a backward


@dataclass(frozen=True)
class Module:
    name: str
    type: str
    inputs: Mapping[str, Any]
    batch: Expr
    seq: Expr
    parameters: int  # the checkpoint's count for this module
    path: str


@dataclass(frozen=True)
class Anyres:
    """LLaVA-NeXT's anyres tiling: the crop size and the grid pinpoints [(h, w), ...] in pixels."""

    tile: int
    pinpoints: tuple[tuple[int, int], ...]

    def grid(self, image_h: int, image_w: int) -> tuple[int, int]:
        """(rows, cols) of tiles for an image: the pinpoint `select_best_resolution` picks.

        transformers/image_processing_utils.py select_best_resolution: the pinpoint with the
        largest effective resolution (the image scaled to fit inside it, no larger than the
        original), ties to the least wasted area, then to the first listed. The scaled sides
        are int(side * scale) with scale = min(W / w, H / h); in integers, the side that
        limits the scale is the pinpoint's and the other is floor(side * W / w)."""
        best, best_key = (0, 0), None
        for h, w in self.pinpoints:
            if w * image_h <= h * image_w:  # width limits: scale = w / image_w
                scaled = w * (image_h * w // image_w)
            else:
                scaled = (image_w * h // image_h) * h
            effective = min(scaled, image_h * image_w)
            key = (effective, -(h * w - effective))
            if best_key is None or key > best_key:
                best, best_key = (h, w), key
        return best[0] // self.tile, best[1] // self.tile


@dataclass(frozen=True)
class ImageResize:
    """The image processor's smart_resize (Qwen2-VL, Qwen2.5-VL): the size the vision tower sees."""

    factor: int  # patch x merge
    min_pixels: int
    max_pixels: int
    MAX_ASPECT = 200  # smart_resize refuses an aspect ratio above it

    def apply(self, height: int, width: int) -> tuple[int, int]:
        """transformers/models/qwen2_vl/image_processing_qwen2_vl.py `smart_resize`: each side
        to the nearest multiple of factor (Python's round, halves to even); an image that then
        lies outside [min_pixels, max_pixels] is rescaled by the square root of the ratio,
        rounding down (too large) or up (too small) to multiples of factor."""
        f = self.factor
        h, w = round(height / f) * f, round(width / f) * f
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
        return h, w


@dataclass(frozen=True)
class VisionChunk:
    """MiniCPM-V 2.6's tower runs at most `slices` slices at a time (get_vllm_embedding's chunks of
    vision_batch_size); an image's slices are its source image and the grid the processor cuts it
    into (scale_resolution `scale`, max_slice_nums `max_slices`: the expression function slice_count)."""

    scale: int
    max_slices: int
    slices: int


@dataclass(frozen=True)
class Spec:
    model: str
    file: str
    source: Mapping[str, str]
    image_tokens: int
    hidden_size: int | None  # the config's hidden_size as HF Trainer reads it (DeepSpeed "auto")
    modules: tuple[Module, ...]
    doc: Document = field(compare=False, repr=False)
    image_size: tuple[int, int] | None = None  # native-resolution towers: the default [h, w]
    anyres: Anyres | None = None  # LLaVA-NeXT's tiling
    image_resize: ImageResize | None = None  # the processor's smart_resize (Qwen2-VL)
    context_length: int | None = None  # max_position_embeddings, where the spec gives it
    # What a LoRA run trains in full besides the adapters when the experiment does not say
    # (the model's own recipe; peft alone freezes every base weight).
    lora_trainable: tuple[str, ...] = ()
    # A video's frames per temporal patch (Qwen2-VL's temporal_patch_size); None: no video input.
    video_temporal_patch: int | None = None
    vision_chunk: VisionChunk | None = None  # the tower runs at most so many slices at once (MiniCPM-V 2.6; more refused, E725)
    encoder_decoder: bool = False  # an encoder over seq_len, a decoder over target_len (T5)
    # The attention implementations transformers accepts for the model, its default first;
    # () when the spec does not say (all three, sdpa the default).
    attention: tuple[str, ...] = ()
    # Where a launch script named this model (--from-command SCRIPT given no model file): the
    # script, line and flags, and what they resolved to, for the output's `from` line.
    origin: Mapping[str, Any] | None = field(default=None, compare=False)

    def module(self, name: str) -> Module | None:
        return next((m for m in self.modules if m.name == name), None)


@dataclass(frozen=True)
class Fsdp:
    """PyTorch FSDP2 (`fully_shard`) over the `dp` ranks: every decoder/encoder layer a unit,
    the root module the last one (accelerate's auto wrap)."""

    reshard_after_forward: bool  # fully_shard(reshard_after_forward=...)
    reduce_dtype: str  # MixedPrecisionPolicy.reduce_dtype: fp32 | bf16 | fp16
    reduce_bytes: int
    sharded_bytes: int  # the sharded (full-precision) parameters' dtype: fp32 under bf16-mixed


# MixedPrecisionPolicy.reduce_dtype -> bytes per gradient element in the reduce-scatter
FSDP_REDUCE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# What an experiment's `parallel.fsdp` block leaves out: fully_shard's reshard_after_forward
# default, and gradients reduced in the sharded parameters' dtype (fp32 under mixed precision).
FSDP_DEFAULTS: Mapping[str, Any] = {"reshard_after_forward": True, "reduce_dtype": "fp32"}


def fsdp_setup(block: Mapping[str, Any] | None, precision: str) -> Fsdp | None:
    if block is None:
        return None
    b = {**FSDP_DEFAULTS, **block}
    param, _, _, master = PRECISIONS[precision]
    return Fsdp(bool(b["reshard_after_forward"]), b["reduce_dtype"], FSDP_REDUCE_BYTES[b["reduce_dtype"]], master or param)


# peft LoraConfig defaults (peft/tuners/lora/config.py) for what an experiment's `lora`
# block leaves out; `modules` restricts the targets to memspec modules.
LORA_DEFAULTS: Mapping[str, Any] = {
    "r": 8,
    "alpha": 8,
    "dropout": 0.0,
    "target_modules": "all-linear",
    "modules": ["language"],
    "modules_to_save": [],
    "bias": "none",
    "use_dora": False,
}


@dataclass(frozen=True)
class Lora:
    """peft LoRA on the linear layers of `modules` that `target_modules` names."""

    r: int
    alpha: float
    dropout: float
    target_modules: str | tuple[str, ...]  # "all-linear" or peft-style names
    modules: frozenset[str]  # their base weights are frozen
    modules_to_save: tuple[str, ...]  # peft names: a module whose full name ends with one is copied and trained
    bias: str  # none | all | lora_only
    use_dora: bool = False  # DoRA: a trainable magnitude per output row, the weight's row norms each forward
    # where each modules_to_save name and the bias were given: (file, line, col, path), for
    # the diagnostics expand raises once it knows the layers
    saves_at: tuple[tuple[str, int, int, str], ...] = field(default=(), compare=False)
    bias_at: tuple[str, int, int, str] | None = field(default=None, compare=False)


# transformers' BitsAndBytesConfig defaults for what an experiment's `quantization` block leaves
# out (bnb_4bit_quant_type "fp4", bnb_4bit_use_double_quant False); `modules` are the memspec
# modules whose linear layers are quantized (LLaVA's --bits loads the language model quantized
# and the vision tower after it, unquantized; llm_int8_skip_modules keeps mm_projector).
QUANTIZATION_DEFAULTS: Mapping[str, Any] = {"quant_type": "fp4", "double_quant": False, "modules": ["language"], "skip_modules": []}


@dataclass(frozen=True)
class Quantization:
    """bitsandbytes weights of the linear layers of `modules` (QLoRA: 4-bit; LLM.int8(): 8-bit)."""

    bits: int  # 4 | 8
    quant_type: str  # nf4 | fp4 (4-bit; same memory)
    double_quant: bool
    modules: frozenset[str]
    skip_modules: tuple[str, ...]  # llm_int8_skip_modules: names (or name suffixes) kept in 16 bits


@dataclass(frozen=True)
class Setup:
    """One training setup, every knob explicit."""

    experiment: str
    file: str  # the experiment file, or the spec file for a bare spec
    micro_batch: int
    seq_len: int
    images_per_sample: int
    image_size: tuple[int, int] | None  # [h, w] pixels: the experiment's, else the spec's, else None
    trainable: frozenset[str]
    precision: str  # a PRECISIONS key
    optimizer: Optimizer
    gradient_checkpointing: frozenset[str]
    attention: str
    dp: int
    zero: int
    deepspeed: DeepSpeed | None  # ZeRO's buffers when zero >= 1
    gpu: Gpu | None  # the GPU asked about (fits / headroom)
    target: Gpu  # the GPU whose architecture the estimate assumes: `gpu`, else the catalog's default
    bytes: Mapping[str, int]  # param, grad, optim, act + the fixed dtypes
    master_bytes: int  # fp32 master copy per trainable parameter (inside bytes.optim)
    state_bytes: int  # one optimizer state element (fp32 with a master copy, else the weight dtype)
    lora: Lora | None = None
    fsdp: Fsdp | None = None  # FSDP2 sharding over the dp ranks (zero is then 0)
    quantization: Quantization | None = None
    # enable_input_require_grads(): the outputs of every input embedding (token embeddings,
    # a vision tower's patch embedding) require grad, so frozen towers record autograd.
    input_require_grads: bool = False
    anyres: Anyres | None = None  # the spec's anyres tiling (LLaVA-NeXT), for grid_rows / grid_cols
    image_resize: ImageResize | None = None  # the spec's processor resize (Qwen2-VL), for image_h / image_w
    loss: str = "cross_entropy"  # one of LOSSES
    # torch.autograd.graph.save_on_cpu around the forward: every saved tensor goes to host
    # memory as it is saved and comes back (a device copy) when its backward node runs.
    activation_offloading: bool = False
    # DataCollatorWithFlattening: the micro-batch's samples concatenated into one row of
    # micro_batch x seq_len tokens, position_ids restarting per sample, no padding.
    packing: bool = False
    # Megatron-style model parallelism of a Llama-style causal LM: tensor-parallel degree,
    # sequence parallelism (norm and residual activations split by tp) and pipeline stages;
    # an estimate is for tensor rank 0 of the first pipeline stage.
    tp: int = 1
    sp: bool = False
    pp: int = 1
    # PYTORCH_CUDA_ALLOC_CONF as the job sets it: what the allocator's replay assumes
    alloc_conf: AllocatorConfig = AllocatorConfig()
    # what the "fits" verdict keeps free on `gpu` (None: the catalog's device.margin_pct)
    margin: Margin | None = None
    # Videos per sample, each of video_frames frames of image_size, which the vision tower
    # reads video_temporal_patch frames at a time (the spec's; 1 where it takes no video).
    videos_per_sample: int = 0
    video_frames: int = 0
    video_temporal_patch: int = 1
    target_len: int = 0  # an encoder-decoder's decoder positions (seq_len the encoder's); else 0
    # how the precision is realized (a PRECISION_MODES key); "" for the precision's default
    # (precision_mode(precision, precision_stated=False))
    precision_mode: str = ""
    # the transformers release the job runs (release_code; default TRANSFORMERS_RELEASE)
    transformers: int = TRANSFORMERS
    # device_map placement across the GPUs of one process (None: the whole model on each GPU)
    device_map: DeviceMap | None = None

    @property
    def mode(self) -> str:
        return self.precision_mode or precision_mode(self.precision, precision_stated=False)

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def vision_items(self) -> int:
        """What the vision tower reads per sample, in images of image_size (`vision_items`)."""
        return vision_items(self.images_per_sample, self.videos_per_sample, self.video_frames, self.video_temporal_patch)

    @property
    def rows(self) -> tuple[int, int]:
        """(batch, seq) of the language model's input: [1, b * s] when packed."""
        return (1, self.tokens) if self.packing else (self.micro_batch, self.seq_len)

    @property
    def image_hw(self) -> tuple[int, int]:
        """(image_h, image_w) as formulas see them, after the processor's resize where the spec
        has one: 0, 0 when no size applies (fixed-size towers)."""
        if self.image_size is None:
            return (0, 0)
        return self.image_resize.apply(*self.image_size) if self.image_resize else self.image_size

    @property
    def grid(self) -> tuple[int, int]:
        """(grid_rows, grid_cols): the anyres tile grid of the image; 0, 0 without tiling."""
        if self.anyres is None or self.image_size is None:
            return (0, 0)
        return self.anyres.grid(*self.image_size)


def vision_items(images: int, videos: int, frames: int, temporal_patch: int) -> int:
    """Each image, and each video's temporal patches (its frames padded to a multiple of the
    temporal patch with the last frame, as Qwen2VLVideoProcessor does), which the vision tower
    reads one by one as images of the frame size."""
    return images + videos * -(-frames // temporal_patch)


def precision_mode(precision: str, stated: str | None = None, *, deepspeed_stated: bool = False, precision_stated: bool = True, fsdp: bool = False) -> str:
    """The PRECISION_MODES key a (canonical) precision is realized by.

    A 16-bit mixed precision is autocast on fp32 weights, as Lightning's "bf16-mixed", HF
    Trainer's --bf16 and accelerate's mixed_precision name it, unless DeepSpeed is stated (its
    bf16 / fp16 optimizer keeps fp32 masters of 16-bit weights, as under Lightning's
    DeepSpeedStrategy) or FSDP2 shards the model (its MixedPrecisionPolicy). `stated`: the
    experiment's own `precision_mode`, which wins. NB: an experiment that states no precision
    at all keeps the master-weight realization it always had (the checked-in experiments,
    goldens and measured records were made with it); state `precision: bf16-mixed` for autocast.
    """
    if precision == "fp32":
        return "fp32"
    if precision not in MIXED_PRECISIONS:
        return "pure"
    if stated:
        return stated
    if fsdp:
        return "fsdp-policy"
    if deepspeed_stated or not precision_stated:
        return "master-weights"
    return "autocast"


def derive_bytes(precision: str, optimizer: Optimizer, mode: str = "") -> tuple[dict[str, int], int, int]:
    """bytes.* for a precision and optimizer, the master-weight bytes and one state's bytes.

    Under autocast (`mode`) the weights, gradients and states are fp32 and there is no master
    copy; bytes.act is the 16-bit dtype of autocast's matmul outputs.

    bytes.optim is the optimizer's bytes per trainable element where its states are
    element-wise; Adafactor's and bitsandbytes' are not (factored moments, 8-bit blocks,
    fp32 states whatever the weight's dtype), and the evaluator computes those per tensor
    (compiler/memory/optimizers.py); their bytes.optim counts the master copy only.
    """
    param, grad, act, master = PRECISIONS[precision]
    if mode == "autocast":
        param, grad, master = FP32_BYTES, FP32_BYTES, 0
    state = 4 if master else param
    per_element = optimizer.n_dense_states * state if optimizers.is_elementwise(optimizer) else 0
    values = {"param": param, "grad": grad, "optim": master + per_element, "act": act, **FIXED_DTYPE_BYTES}
    return values, master, state
