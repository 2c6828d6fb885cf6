"""The training-setup knobs the command line sets, one entry each, in the order `--help` lists them.

Contract: `KNOBS` is the registry: each `Knob` names its flag, the experiment key it sets (the
same name in `schemas/experiment.schema.json`, or in its `parallel` block), or the experiment
block a few flags build together (`optimizer`, `lora`, `fsdp`, `quantization`, `versions`:
`compiler.cli_parser.overrides` assembles those), and how argparse reads it. `compiler.cli_parser`
adds every knob to the verbs that take a training setup; tests/test_knobs.py holds each key to the
schema. A new knob is one entry here, its key in the schema, and what `resolve` makes of it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from .memory.optimizers import HF_OPTIM, IMPLS, TYPES


def as_list(text: str) -> list[str]:
    """'a,b' -> ['a', 'b']; '' and 'none' -> []."""
    return [] if text in ("", "none") else [x.strip() for x in text.split(",") if x.strip()]


def device_map(text: str) -> str | dict[str, int | str]:
    """'auto' -> 'auto'; 'model.embed_tokens=0,model.layers.0=1' -> {name: GPU} (checked by resolve)."""
    if "=" not in text:
        return text
    out: dict[str, int | str] = {}
    for item in as_list(text):
        name, _, gpu = item.partition("=")
        out[name.strip()] = int(gpu) if gpu.strip().isdigit() else gpu.strip()
    return out


def max_memory(text: str) -> list[int | str]:
    """'20GiB,20GiB' -> one size per GPU, in order (a bare number is bytes)."""
    return [int(x) if x.isdigit() else x for x in as_list(text)]


def image_size(text: str) -> list[int]:
    """'448x448' -> [448, 448] (height, width)."""
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW in pixels, e.g. 448x448, got {text!r}") from None
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f"image height and width must be positive, got {text!r}")
    return [h, w]


@dataclass(frozen=True)
class Knob:
    flag: str
    # the experiment key the flag's value overrides as it is (top level, or in `parallel`);
    # None for a flag that `block` names, which compiler.cli_parser.overrides assembles
    key: str | None
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None
    action: Any = None  # argparse's: store_const, store_true, BooleanOptionalAction
    const: Any = None
    dest: str | None = None  # argparse's attribute when it is not the key's
    block: str | None = None  # optimizer, lora, fsdp, quantization, versions

    @property
    def attribute(self) -> str:
        """The argparse attribute that holds the value."""
        return self.dest or self.key or self.flag[2:].replace("-", "_")

    def add_to(self, group) -> None:
        kw: dict[str, Any] = {"dest": self.attribute, "help": self.help}
        for name in ("type", "metavar", "action", "const"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        if self.choices is not None:
            kw["choices"] = list(self.choices)
        if self.action is argparse.BooleanOptionalAction:
            kw["default"] = None
        group.add_argument(self.flag, **kw)


PRECISIONS = ("bf16-mixed", "16-mixed", "bf16-true", "16-true", "32-true", "32", "bf16", "fp16-mixed", "fp32")
OPTIMIZERS = tuple(TYPES) + tuple(n for n in HF_OPTIM if n not in TYPES)

KNOBS: tuple[Knob, ...] = (
    Knob("--micro-batch", "micro_batch", "samples per GPU per step", type=int, metavar="N"),
    Knob("--seq-len", "seq_len", "LLM positions per sample, image tokens included", type=int, metavar="N"),
    Knob("--target-len", "target_len", "decoder positions per sample of an encoder-decoder model (T5; --seq-len is then the encoder's)", type=int, metavar="N"),
    Knob("--images-per-sample", "images_per_sample", type=int, metavar="N"),
    Knob("--videos-per-sample", "videos_per_sample", "videos per sample (Qwen2-VL), each of --video-frames frames of --image-size", type=int, metavar="N"),
    Knob("--video-frames", "video_frames", "frames sampled per video", type=int, metavar="N"),
    Knob("--image-size", "image_size", "input image height x width in pixels (native-resolution towers, Qwen2-VL)", type=image_size, metavar="HxW"),
    Knob("--trainable", "trainable", "trainable modules, e.g. projector,language ('none' for none)", type=as_list, metavar="M,M"),
    Knob(
        "--precision",
        "precision",
        "Lightning's names: bf16-mixed / 16-mixed is torch.autocast on fp32 weights, or 16-bit weights with fp32 masters "
        "when a ZeRO stage (--zero, --deepspeed) is given; bf16-true / 16-true pure 16-bit; 32-true fp32. "
        "bf16 = bf16-true, fp16-mixed = 16-mixed. Unset: bf16-mixed with fp32 master weights",
        choices=PRECISIONS,
    ),
    Knob(
        "--precision-mode",
        "precision_mode",
        "how bf16-mixed / 16-mixed runs when the rule above is not what the job does: autocast (fp32 weights, "
        "torch.autocast) or master-weights (16-bit weights, fp32 masters: DeepSpeed, Megatron)",
        choices=("autocast", "master-weights"),
    ),
    Knob(
        "--optimizer",
        None,
        f"{', '.join(TYPES)}, or a Hugging Face --optim name ({', '.join(n for n in HF_OPTIM if n not in TYPES)}), e.g. --optimizer paged_adamw_8bit",
        choices=OPTIMIZERS,
        metavar="NAME",
        block="optimizer",
    ),
    Knob("--optimizer-impl", None, choices=tuple(IMPLS), block="optimizer"),
    Knob("--momentum", None, "SGD momentum (0 for none); Adafactor beta1 (0: no first moment)", type=float, metavar="X", block="optimizer"),
    Knob("--weight-decay", None, "weight decay; changes memory only for adam and sgd (coupled: a gradient copy)", type=float, metavar="X", block="optimizer"),
    Knob(
        "--param-groups",
        None,
        "optimizer parameter groups: one (every tensor), or trainer (Hugging Face Trainer's weight-decay and "
        "no-decay groups; torch steps one group at a time), e.g. --param-groups trainer",
        choices=("one", "trainer"),
        block="optimizer",
    ),
    Knob("--gradient-checkpointing", "gradient_checkpointing", "modules whose layers are checkpointed ('none' for none)", type=as_list, metavar="M,M"),
    Knob("--attention", "attention", choices=("flash_attention_2", "sdpa", "eager")),
    Knob("--dp", "dp", "data-parallel degree", type=int, metavar="N"),
    Knob("--zero", "zero", "DeepSpeed ZeRO stage", type=int, choices=(0, 1, 2, 3)),
    Knob(
        "--offload-optimizer",
        "offload_optimizer",
        "DeepSpeed zero_optimization.offload_optimizer.device: fp32 master weights, gradient partition and "
        "optimizer states in host memory (cpu: ZeRO 1-3; nvme: ZeRO-3), e.g. --zero 2 --offload-optimizer cpu",
        choices=("none", "cpu", "nvme"),
    ),
    Knob(
        "--offload-param",
        "offload_param",
        "DeepSpeed zero_optimization.offload_param.device (ZeRO-3, with --offload-optimizer): the 16-bit partitions "
        "in host memory, e.g. --zero 3 --offload-optimizer cpu --offload-param cpu",
        choices=("none", "cpu", "nvme"),
    ),
    Knob("--fsdp", None, "PyTorch FSDP2 (fully_shard) over the --dp ranks, e.g. --fsdp --dp 8", action="store_true", block="fsdp"),
    Knob(
        "--fsdp-reshard-after-forward",
        None,
        "FSDP2 reshard_after_forward (default true; false keeps every layer gathered until its backward); implies --fsdp",
        choices=("true", "false"),
        dest="fsdp_reshard",
        block="fsdp",
    ),
    Knob(
        "--fsdp-reduce-dtype",
        None,
        "FSDP2 MixedPrecisionPolicy.reduce_dtype (default fp32); implies --fsdp",
        choices=("fp32", "bf16", "fp16"),
        dest="fsdp_reduce",
        block="fsdp",
    ),
    Knob("--tp", "tp", "Megatron tensor-parallel degree (Llama-style text-only models), e.g. --tp 8", type=int, metavar="N"),
    Knob("--sp", "sp", "Megatron sequence parallelism (with --tp > 1)", action=argparse.BooleanOptionalAction),
    Knob("--pp", "pp", "pipeline stages (1F1B); the estimate is the first stage's, e.g. --pp 4", type=int, metavar="N"),
    Knob(
        "--loss",
        "loss",
        "causal-LM loss: transformers' cross-entropy over fp32 logits (default), or Liger's fused linear cross-entropy "
        "(use_liger_kernel), which never holds the full logits",
        choices=("cross_entropy", "fused_linear_cross_entropy"),
    ),
    Knob(
        "--packing",
        "packing",
        "pack the micro-batch into one row of micro-batch x seq-len tokens (DataCollatorWithFlattening; text-only)",
        action=argparse.BooleanOptionalAction,
    ),
    Knob(
        "--activation-offloading",
        "activation_offloading",
        "torch.autograd.graph.save_on_cpu around the forward: saved tensors wait in host memory (not with checkpointing)",
        action=argparse.BooleanOptionalAction,
    ),
    Knob(
        "--gpu",
        "gpu",
        "GPU from specs/gpus.yaml, e.g. h100-80gb, or its memory as nvidia-smi's memory.total, "
        "e.g. 24GiB (2^30 bytes) or 80GB (10^9 bytes): say whether it fits",
        metavar="NAME|SIZE",
    ),
    Knob(
        "--margin",
        "margin",
        "memory a 'fits' verdict keeps free beyond the device figure: a percentage of the GPU "
        "(5%%) or a size (2GiB); default specs/gpus.yaml device.margin_pct, the estimate's measured error; --margin 0 for none",
        metavar="PCT|SIZE",
    ),
    Knob(
        "--device-map",
        "device_map",
        "from_pretrained's device_map: the model split across the GPUs of one process, auto, balanced, "
        "balanced_low_0 or sequential with --max-memory, or name=GPU,... (model.layers.0=0,...); the estimate is per GPU, e.g. "
        "--device-map auto --max-memory 20GiB,20GiB",
        type=device_map,
        metavar="RULE|NAME=GPU,...",
    ),
    Knob(
        "--max-memory",
        "max_memory",
        "from_pretrained's max_memory, one size per GPU as accelerate reads it, e.g. 20GiB,20GiB",
        type=max_memory,
        metavar="SIZE,SIZE",
    ),
    Knob(
        "--alloc-conf",
        "alloc_conf",
        "PYTORCH_CUDA_ALLOC_CONF of the job, which the allocator's replay assumes (default: the experiment's "
        "alloc_conf, else PyTorch's defaults), e.g. --alloc-conf expandable_segments:True",
        metavar="CONF",
    ),
    Knob(
        "--transformers-version",
        None,
        "the transformers release the job runs, e.g. 4.46.3: the loss of that release "
        "(modelled: 4.43 and later, older ones on Llama-style causal LMs; default: the formulas' own, 5.23.0)",
        metavar="X.Y.Z",
        dest="transformers_version",
        block="versions",
    ),
    Knob("--lora-r", None, "LoRA (peft) rank on the language model: its base weights freeze", type=int, metavar="N", block="lora"),
    Knob("--lora-alpha", None, "LoRA alpha (no effect on memory)", type=float, metavar="X", block="lora"),
    Knob("--lora-dropout", None, "LoRA dropout probability (0 for none)", type=float, metavar="P", block="lora"),
    Knob("--lora-targets", None, "peft target_modules, e.g. q_proj,v_proj, or all-linear", type=as_list, metavar="M,M", block="lora"),
    Knob("--lora-dora", None, "DoRA (peft use_dora=True), e.g. --lora-r 16 --lora-dora", action="store_const", const=True, block="lora"),
    Knob(
        "--lora-modules-to-save",
        None,
        "peft modules_to_save: a trained copy of each module whose name ends with one, beside its frozen original "
        "('none' for none), e.g. --lora-modules-to-save lm_head,embed_tokens or multi_modal_projector",
        type=as_list,
        metavar="M,M",
        dest="lora_save",
        block="lora",
    ),
    Knob(
        "--lora-bias",
        None,
        "peft bias: 'all' trains every bias of the model (frozen towers included), 'lora_only' those of the adapted layers, e.g. --lora-r 16 --lora-bias all",
        choices=("none", "all", "lora_only"),
        block="lora",
    ),
    Knob(
        "--quantization",
        None,
        "bitsandbytes weights of the language model's linear layers: 4 (QLoRA, NF4/FP4) or 8 (LLM.int8()), e.g. --quantization 4 --double-quant --lora-r 64",
        type=int,
        choices=(4, 8, 16),
        metavar="BITS",
        block="quantization",
    ),
    Knob("--quant-type", None, "4-bit data type (same memory)", choices=("nf4", "fp4"), block="quantization"),
    Knob("--double-quant", None, "bnb_4bit_use_double_quant: 8-bit absmax", action="store_const", const=True, block="quantization"),
)
