"""Diagnostics and the exceptions that carry them.

Contract: every problem with a user's input becomes a `Diagnostic` with a stable code and a
location; a stage collects all diagnostics of a file and raises them together as one
`MemspecError`. The rendered form is location first, one diagnostic per block:

    specs/x.yaml:14:9: E203 $.modules.language.layers: unknown key 'hiden'
    help: did you mean 'hidden'?

Exit codes: `MemspecError` 1 (the input is wrong), `UsageError` 2 (the command line is
wrong). Anything else that escapes is a bug (exit 3, with a traceback), decided by the CLI.
Exit 4 is no error: `memspec estimate --fail-if-oom` when the estimate does not fit the GPU.

Codes (stable; never reuse a retired one):
    E101 file not found / not a file / unreadable    E201 missing required key
    E102 YAML syntax error                           E202 wrong type
    E103 duplicate mapping key                       E203 unknown key
    E104 anchor, alias or merge key                  E204 number out of range
    E105 mapping key that is not a string            E205 value not among the allowed ones
    E106 empty document                              E206 string shape (pattern, length)
    E107 more than one document                      E207 list or mapping size, unique items
    E108 ambiguous boolean (yes/no/on/off)           E208 other schema violation
    E109 ambiguous number (leading zero)
    E110 explicit tag
    E111 a short name that names more than one bundled spec or experiment

    formulas and specs (layer types, expressions, examples):
    E301 unknown layer type (a spec's module, a composite's child)
    E302 layer_type differs from the formula file's name      E303 circular composite
    E304 unknown module (trainable, checkpointing, LoRA, quantization name none of the spec's)
    E401 undeclared name in an expression, or a tensor name no input declares
    E402 expression that does not parse                       E403 expression outside the allowed arithmetic
    E404 expression that cannot be evaluated or is not an integer
    E405 let: name that shadows an input or context name      E407 a formula example's expectation is off
    E406 a composite child repeated more than 1,024 times (a layer count no published model has)
    E501 seq_len shorter than the image tokens it must hold   E502 formulas' and spec's parameter counts differ
    E503 unknown GPU                                          E505 DeepSpeed 'auto' sizes without the spec's hidden_size
    E506 a memory size (--gpu 24GiB, --margin 2GiB) that cannot be read: no unit, an unknown one, not whole bytes, or a GPU too small for the CUDA context
    E330 PYTORCH_CUDA_ALLOC_CONF option or value the caching allocator does not take
    E331 versions.transformers that is no release, one not modelled (before 4.43), or one before 4.49 with a formula the spec instantiates that does not list older_transformers in `setups:`
    E332 device_map / max_memory: a value from_pretrained does not take (an unknown strategy or module, a GPU beyond max_memory, a size accelerate cannot read), weights the rule would offload to cpu or disk, or a combination not modelled (dp, ZeRO, FSDP, tp, pp, quantization)
    E333 target_len on a model that is no encoder-decoder (a decoder-only spec has no target sequence)
    E334 LoRA on a linear peft moves to the stacked routed experts for the model type (DeepSeek-V2's gate_proj, up_proj, down_proj): not modelled
    E335 a LoRA target peft would also match in a module outside lora.modules, where the recipes wrap the whole model (CogVLM2's tower and projector)
    E336 gradient_checkpointing on a model whose remote code neither checkpoints nor lets transformers checkpoint it (CogVLM v1: supports_gradient_checkpointing False)
    E601 the measuring side (torch, transformers) is not installed

    memspec import (a hub id or a model folder; each message names the repo and revision):
    E701 repo not found, or neither a folder nor a repo id   E708 no family covers the model_type
    E702 gated repo: access not granted or no token          E709 header tensors no module claims
    E703 offline (HF_HUB_OFFLINE, no network), not cached    E710 formulas' and header's counts differ
    E704 revision not found (or --revision for a folder)     E711 quantized checkpoint: not estimated yet
    E705 config.json missing or not valid JSON               E712 output file exists (no --force)
    E706 config.json lacks a key a family needs (no default) E713 config value unusable / unsupported variant
    E707 safetensors header truncated, oversized, not JSON, inconsistent, or a shard missing
    E717 anyres tiling (LLaVA-NeXT): grid pinpoints missing or not [height, width] pairs, or no image size
    E714 attention implementation the model's spec does not list (transformers refuses it)
    E724 image size the processor refuses (Qwen2-VL's smart_resize: aspect ratio above 200)
    E725 more image slices in a micro-batch than the vision tower runs at once (MiniCPM-V 2.6's vision_batch_size chunks): not modelled

    estimating (the experiment against the spec's formulas):
    E723 seq_len shorter than the image tokens at the experiment's image size (dynamic tiles, native resolution)

    training setup (an experiment file or its flags):
    E315 activation_offloading with gradient_checkpointing (not modelled)
    E316 packing or activation offloading with images in the batch, or with a formula the spec instantiates that does not list it in `setups:`
    E317 loss: fused_linear_cross_entropy on a spec without a causal-LM head, or with a formula that does not list it in `setups:`
    E318 tensor / sequence / pipeline parallelism on a setup it is not modelled for, or with a formula that does not list it in `setups:`
    E319 tp or pp that does not divide the heads, the MLP or the layers
    E320 lora.modules_to_save name that matches no module (peft's suffix rule; peft itself ignores it silently)
    E321 peft modules_to_save or bias with FSDP2, or bias with DoRA (not modelled)
    E322 modules_to_save matching inside another match or a LoRA layer, or copying a bitsandbytes-quantized linear
    E323 peft bias on a layer whose formula does not give its bias as a tensor (bitsandbytes linears, SigLIP's head)
    E324 images_per_sample above 0 on a model without a vision tower (a text-only spec)
    E325 bf16-mixed / 16-mixed as torch.autocast on fp32 weights (no DeepSpeed stated) with a formula the spec instantiates that does not list autocast in `setups:`, or a setup it is not modelled with
    E327 videos_per_sample above 0 on a model that takes no video (its spec has no video_temporal_patch)
    E326 a LoRA target that is a layer peft would wrap whole, not modelled (InternLM-XComposer2's Partial LoRA linears)
    E328 videos_per_sample without video_frames, or video_frames without videos
    E329 torch_compile: true (a compiled step's saved activations are not modelled until measured)

    --deepspeed / --from-command (a DeepSpeed config, a launch script):
    E801 DeepSpeed config value of the wrong type or range   E811 no launch command, or no training script
    E802 offload DeepSpeed lacks (nvme or params below ZeRO-3) E812 flag value unusable (not a bool/number, unset shell variable)
    E803 config number disagrees with the command's flag     E813 flag that changes memory, not modelled (optim, anyres, bits, torch_compile)
    E804 accelerate config value of the wrong type or range  E805 accelerate feature not modelled (FSDP1, size wrap, offload, fp8, dynamo)
    E814 --from-command without a model file: the script names no --model_name_or_path, or one that is no folder, bundled spec
         or readable hub id (a LLaVA script: no bundled spec built from its --model_name_or_path, --vision_tower, --mm_projector_type)

    memspec report (the HTML page):
    E901 the page cannot be written to -o (a folder, no such folder, not permitted)
    E902 -o - with --format json (both would go to stdout)
    E903 an output file (report -o, sweep -o / --svg) exists and --force is not given

    memspec sweep (a value list on the command line) and memspec diff (a git revision):
    E911 value list unreadable: not an integer, empty item   E916 not inside a git repository, or git not found
    E912 range backwards, step < 1 or factor < 2, too many   E917 base revision unknown to git, or unreadable
    E913 value outside the knob's range or choices           E918 the base revision's cases could not be evaluated
    E914 chart: no knob with two values, or --x not swept

    memspec validate --history (an allocator history beside one record):
    E921 not an allocator history (memspec measure --memory-history's gzip JSON lines)
    E922 the record has no estimate to compare the history with

    the training setup (an experiment, flags, the files read):
    E310 FSDP and a DeepSpeed ZeRO stage together            E311 optimizer offload with ZeRO-0, or to nvme below ZeRO-3
    E806 offload_param with a ZeRO stage other than 3        E807 offload_param without offload_optimizer
    E305 optimizer option that does not apply to its type or implementation (impl, bits, paged, momentum)
    E306 Adafactor on a layer whose formula gives parameter bytes without shapes
    E307 a quantized (bitsandbytes 4-/8-bit) module listed as trainable
    E308 an optimizer the FSDP2 walk does not model (Adafactor, bitsandbytes, SGD with weight decay)
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Diagnostic:
    """One problem at one place. `line`/`col` are 1-based, 0 when unknown; `path` is a JSON
    path ("$", "$.a[0].b") or "" when the problem concerns no particular value."""

    code: str
    file: str
    line: int
    col: int
    path: str
    message: str
    help: str | None = None

    def render(self, source: bool = False) -> str:
        """`file:line:col: CODE path: message`, then `help: ...` on its own line; with
        `source`, the offending line of the file and a caret under the column between them.

        NB: unknown parts of the location are left out rather than shown as 0
        (`file: CODE ...`, `file:line: CODE ...`), and with no file at all (command-line
        usage) the location is omitted entirely.
        """
        text = f"{self.code} {self.path}: {self.message}" if self.path else f"{self.code} {self.message}"
        location = _location(self.file, self.line, self.col)
        if location:
            text = f"{location}: {text}"
        excerpt = _excerpt(self.file, self.line, self.col) if source else ""
        if excerpt:
            text = f"{text}\n{excerpt}"
        if self.help is not None:
            text = f"{text}\nhelp: {self.help}"
        return text


def _location(file: str, line: int, col: int) -> str:
    if not file:
        return ""
    if line <= 0:
        return file
    if col <= 0:
        return f"{file}:{line}"
    return f"{file}:{line}:{col}"


def _excerpt(file: str, line: int, col: int) -> str:
    """The source line with its number and a caret under `col`, as compilers show it."""
    if not file or line <= 0:
        return ""
    try:
        with open(file, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    if line > len(lines):
        return ""
    number = str(line)
    gutter = " " * len(number)
    caret = f"\n{gutter} | {' ' * (col - 1)}^" if col > 0 else ""
    return f"{gutter} |\n{number} | {lines[line - 1]}{caret}"


def _sort_key(diagnostic: Diagnostic) -> tuple[str, int, int]:
    return (diagnostic.file, diagnostic.line, diagnostic.col)


class MemspecError(Exception):
    """The user's input is wrong. Carries every diagnostic found, sorted by location."""

    exit_code = 1

    def __init__(self, diagnostics: Sequence[Diagnostic] | Diagnostic):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = (diagnostics,)
        if not diagnostics:
            # NB: an error nobody can read is a bug in the caller, not a user error.
            raise ValueError(f"{type(self).__name__} needs at least one Diagnostic")
        # sorted() is stable, so diagnostics at one location keep the order they were found in.
        self.diagnostics: tuple[Diagnostic, ...] = tuple(sorted(diagnostics, key=_sort_key))
        super().__init__(self.diagnostics)

    def render(self, source: bool = False) -> str:
        """All diagnostics, blank-line separated, then `N errors` when there is more than one;
        `source` adds each one's line of the file (what the CLI prints)."""
        blocks = [d.render(source) for d in self.diagnostics]
        if len(blocks) > 1:
            blocks.append(f"{len(blocks)} errors")
        return "\n\n".join(blocks)

    def __str__(self) -> str:
        return self.render()


class UsageError(MemspecError):
    """The command line is wrong (an unknown flag, a missing argument)."""

    exit_code = 2


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """`did you mean 'x'?` for the closest of `choices`, or None when nothing is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else None
