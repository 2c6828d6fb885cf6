"""Reading what users already have: the launch command line of a training script.

Contract:
- `launch_command.read_command(path)` finds the `deepspeed` / `torchrun` / `accelerate launch`
  / `python` command in a shell script and parses its launcher options and HF
  `TrainingArguments` / LLaVA flags into a `Command` (flag values with their positions);
  re-exported here.
- `command_overrides(command, modules)` turns a `Command` into experiment overrides for a
  model with those modules.
- `flag_text(command, name)` is one flag's value, a script variable substituted (what
  `script_model` reads the model from).
- The configs a command names are read by `deepspeed_config.read_deepspeed` (a DeepSpeed
  JSON) and `accelerate.read_accelerate` (an accelerate config YAML), re-exported here.

Each returns a `Reading`: the overrides (experiment keys, as `resolve_setup` takes them) and
the notes a user must see: flags and keys that are not used, assumptions, warnings. Nothing
is dropped without a note. Problems are raised together as one `MemspecError`; nothing
prints.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError
from ..memory.optimizers import HF_OPTIM
from .accelerate import read_accelerate  # noqa: F401  (re-exported: the readers of one command's files)
from .deepspeed_config import Reading, read_deepspeed  # noqa: F401  (re-exported)
from .launch_command import Command, Flag, read_command  # noqa: F401  (re-exported: the command itself)

# A flag's value that is a script variable ($NAME, ${NAME}, $1), and HfArgumentParser's words
# for a boolean (transformers.hf_argparser.string_to_bool)
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*|[0-9])\}?$")
TRUE_WORDS = ("yes", "true", "t", "y", "1")
FALSE_WORDS = ("no", "false", "f", "n", "0")

# HF TrainingArguments / LLaVA flags with no effect on the memory of a step.
NO_MEMORY_EFFECT = frozenset(
    {
        "output_dir",
        "num_train_epochs",
        "max_steps",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
        "evaluation_strategy",
        "eval_strategy",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "learning_rate",
        "weight_decay",
        "warmup_ratio",
        "warmup_steps",
        "lr_scheduler_type",
        "logging_steps",
        "tf32",
        "report_to",
        "dataloader_num_workers",
        "lazy_preprocess",
        "data_path",
        "image_folder",
        "version",
        "seed",
        "run_name",
        "group_by_modality_length",
        "mm_use_im_start_end",
        "mm_use_im_patch_token",
        "pretrain_mm_mlp_adapter",
        "mm_projector_lr",
        "logging_dir",
        "overwrite_output_dir",
        "do_train",
        "remove_unused_columns",
        "max_grad_norm",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "save_only_model",
        "cache_dir",
        "local_rank",
        "mpt_attn_impl",
        "freeze_backbone_bool",
        "ddp_find_unused_parameters",
        "dataloader_pin_memory",
        "push_to_hub",
    }
)
# The training entry points whose attention implementation is fixed in code (LLaVA's
# train_mem.py calls train(attn_implementation="flash_attention_2")).
ENTRY_ATTENTION = {"train_mem.py": "flash_attention_2"}
# HF --optim names -> memspec's optimizer: compiler/memory/optimizers.py, HF_OPTIM.
OPTIM = HF_OPTIM
# LLaVA's TrainingArguments defaults (llava/train/train.py).
LLAVA_LORA_DEFAULTS = {"r": 64, "alpha": 16, "dropout": 0.05, "bias": "none"}
# TRL's ModelConfig defaults (trl/trainer/model_config.py: lora_r 16, lora_alpha 32,
# lora_dropout 0.05); get_peft_config passes bias "none"
TRL_LORA_DEFAULTS = {"r": 16, "alpha": 32, "dropout": 0.05, "bias": "none"}
# peft's target_modules when none is given, for the Llama-style causal LMs
# (utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: llama, mistral,
# mixtral, qwen2, qwen3, gemma, gemma2, gemma3_text)
PEFT_DEFAULT_TARGETS = ["q_proj", "v_proj"]
LLAVA_PROJECTORS = {"mlp2x_gelu": "mlp_projector"}
LLAVA_ASPECT_RATIOS = ("pad", "square", "None")
USED = frozenset(
    {
        "per_device_train_batch_size",
        "model_max_length",
        "max_seq_length",
        "gradient_checkpointing",
        "bf16",
        "fp16",
        "optim",
        "deepspeed",
        "lora_enable",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_bias",
        "tune_mm_mlp_adapter",
        "freeze_backbone",
        "freeze_mm_mlp_adapter",
        "unfreeze_mm_vision_tower",
        "vision_tower",
        "mm_projector_type",
        "image_aspect_ratio",
        "mm_vision_select_layer",
        "attn_implementation",
        "bits",
        "double_quant",
        "quant_type",
        "model_name_or_path",
        "num_gpus",
        "nproc_per_node",
        "use_liger_kernel",
        "padding_free",
        "use_peft",
        "lora_target_modules",
        "lora_modules_to_save",
        "torch_compile",
        "torch_compile_backend",
        "torch_compile_mode",
    }
)


class _Reader:
    """Typed access to a command's flags, collecting every problem."""

    def __init__(self, command: Command):
        self.c = command
        self.flags = {f.name: f for f in command.flags}
        self.problems: list[Diagnostic] = []

    def bad(self, name: str, message: str, help: str, code: str = "E812") -> None:
        f = self.flags[name]
        self.problems.append(Diagnostic(code, self.c.file, f.line, f.col, "--" + name, message, help))

    def raw(self, name: str) -> str | None:
        """The flag's text with a script variable substituted; None when absent or unusable."""
        value = self.flags[name].value
        m = _VARIABLE.match(value or "")
        if m:
            resolved = self.c.variables.get(m.group(1))
            if resolved is None or _VARIABLE.match(resolved) or resolved.startswith("$"):
                self.bad(
                    name,
                    f"is the shell variable {value}, whose value the script does not set",
                    "write the value in the script: memspec reads the script, it does not run it",
                )
                return None
            return resolved
        return value

    def boolean(self, name: str) -> bool | None:
        if name not in self.flags:
            return None
        if self.flags[name].value is None:
            return True  # NB: HfArgumentParser reads a bare --flag as True
        value = self.raw(name)
        if value is None:
            return None
        if value.lower() in TRUE_WORDS:
            return True
        if value.lower() in FALSE_WORDS:
            return False
        self.bad(name, f"expected True or False, got {value!r}", "write True or False")
        return None

    def integer(self, name: str, minimum: int = 1) -> int | None:
        if name not in self.flags:
            return None
        value = self.raw(name)
        if value is None:
            return None
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum:
            self.bad(name, f"expected an integer >= {minimum}, got {value!r}", f"write a number, e.g. --{name} 16")
            return None
        return number

    def number(self, name: str) -> float | None:
        if name not in self.flags:
            return None
        value = self.raw(name)
        try:
            return float(value) if value is not None else None
        except ValueError:
            self.bad(name, f"expected a number, got {value!r}", f"write a number, e.g. --{name} 0.05")
            return None

    def text(self, name: str) -> str | None:
        return self.raw(name) if name in self.flags else None


def flag_text(command: Command, name: str) -> tuple[Flag, str | None] | None:
    """The command's flag `name` and its text, a script variable substituted (None for a bare
    flag); None when the command lacks it. A variable the script does not set is E812."""
    r = _Reader(command)
    if name not in r.flags:
        return None
    value = r.raw(name)
    if r.problems:
        raise MemspecError(r.problems)
    return r.flags[name], value


def command_overrides(command: Command, modules: Mapping[str, Mapping[str, Any]], model: str, model_from_script: bool = False) -> Reading:
    """Experiment overrides from a launch command, for a model whose modules (name -> type
    and inputs) are given; `model` names the spec in notes. `model_from_script`: the model is
    the one the script's --model_name_or_path names (no file was given to memspec), so the
    flag is read, not set aside with a warning."""
    r = _Reader(command)
    out: dict[str, Any] = {}
    notes: list[str] = []
    mb = r.integer("per_device_train_batch_size")
    if mb is not None:
        out["micro_batch"] = mb
    for name in ("model_max_length", "max_seq_length"):
        seq = r.integer(name)
        if seq is not None:
            out["seq_len"] = seq
    gc = r.boolean("gradient_checkpointing")
    if gc is not None:
        # NB: gradient_checkpointing_enable() reaches the language model's layers; LLaVA's
        # vision tower runs under no_grad, so it has nothing to recompute
        out["gradient_checkpointing"] = ["language"] if gc and "language" in modules else []
    # TrainingArguments(use_liger_kernel=True) patches Liger's fused linear cross-entropy into
    # the causal LM's forward; TRL's SFTConfig(padding_free=True) packs with position_ids
    # (DataCollatorWithFlattening's format)
    if r.boolean("use_liger_kernel"):
        out["loss"] = "fused_linear_cross_entropy"
    if r.boolean("padding_free"):
        out["packing"] = True
    _refuse_compile(r)
    out.update(_precision_flags(r, command, notes))
    out.update(_optimizer_flag(r, notes))
    out.update(_param_groups(command, notes))
    out.update(_trainable_flags(r, modules))
    out.update(_llava_checks(r, modules))
    attention = r.text("attn_implementation") or ENTRY_ATTENTION.get(Path(command.entry).name)
    if attention:
        out["attention"] = attention
    out.update(_bits_flags(r))
    out.update(_dp_flag(r, command, notes))
    if "model_name_or_path" in r.flags and not model_from_script:
        notes.append(
            f"warning: the model is {model}, the file given to memspec; the script's --model_name_or_path {r.flags['model_name_or_path'].value} is not read"
        )
    if r.problems:
        raise MemspecError(r.problems)
    return Reading(out, tuple(notes + _ignored_notes(command)))


def _bits_flags(r: _Reader) -> dict[str, Any]:
    """LLaVA's --bits 4 / 8 (with --double_quant, --quant_type): the language model's linears
    quantized by bitsandbytes."""
    bits = r.integer("bits")
    if bits is not None and bits not in (4, 8, 16):
        r.bad("bits", f"--bits {bits}: LLaVA's train.py quantizes to 4 or 8 bits (16: none)", "write --bits 4, 8 or 16", "E812")
    elif bits in (4, 8):
        # NB: LLaVA's train.py: BitsAndBytesConfig(load_in_4bit / load_in_8bit,
        # llm_int8_skip_modules=["mm_projector"], bnb_4bit_use_double_quant=--double_quant
        # (default True), bnb_4bit_quant_type=--quant_type (default nf4)); the vision tower is
        # loaded after from_pretrained, unquantized
        double = r.boolean("double_quant")
        return {
            "quantization": {
                "bits": bits,
                "quant_type": r.text("quant_type") or "nf4",
                "double_quant": True if double is None else double,
                "modules": ["language"],
            }
        }
    return {}


def _dp_flag(r: _Reader, command: Command, notes: list[str]) -> dict[str, Any]:
    """dp: the launcher's processes over all nodes, else a --num_gpus / --nproc_per_node the
    script is passed; a note when neither says."""
    dp = command.gpus * command.nodes if command.gpus else None
    for name in ("num_gpus", "nproc_per_node"):  # NB: some scripts pass these to the training script
        n = r.integer(name)
        if n is not None and dp is None:
            dp = n
    if dp is not None:
        return {"dp": dp}
    notes.append(
        f"note: {command.file}:{command.line}: the {command.launcher} command does not say how many GPUs (it uses every visible one): dp comes from --dp, else the experiment, else 1"
    )
    return {}


def _ignored_notes(command: Command) -> list[str]:
    """What the estimate does not read: flags without effect on memory, unknown flags, positional arguments."""
    notes = []
    ignored = [f"--{f.name}" for f in command.flags if f.name not in USED]
    unknown = [n for n in ignored if n[2:] not in NO_MEMORY_EFFECT]
    known = [n for n in ignored if n[2:] in NO_MEMORY_EFFECT]
    if known:
        notes.append(f"note: ignored flags (no effect on memory): {' '.join(known)}")
    if unknown:
        notes.append(f"warning: ignored flags (unknown to memspec, assumed without effect on memory): {' '.join(unknown)}")
    if command.positionals:
        notes.append(f"note: ignored arguments: {' '.join(command.positionals)}")
    return notes


def _refuse_compile(r: _Reader) -> None:
    """TrainingArguments compiles the model with --torch_compile, or with a backend or mode
    named (either sets torch_compile): inductor's fused kernels and its min-cut partitioner
    choose what is saved for backward, so the eager step's activations are not the compiled
    step's, and no compiled step has been measured yet."""
    for name in ("torch_compile", "torch_compile_backend", "torch_compile_mode"):
        if name in r.flags and (r.boolean(name) if name == "torch_compile" else r.text(name)):
            r.bad(
                name,
                "torch.compile changes which activations are saved, and a compiled step is not modelled",
                "drop it to estimate the eager step (the compiled step's saved activations may be more or fewer)",
                "E813",
            )
            return


def _precision_flags(r: _Reader, command, notes: list[str]) -> dict[str, Any]:
    """HF Trainer trains in fp32 unless --bf16 or --fp16. With --deepspeed that is DeepSpeed's
    bf16 / fp16 optimizer: 16-bit weights, fp32 master weights. Without it the Trainer runs the
    forward under torch.autocast (Trainer.autocast_smart_context_manager, through accelerate's
    mixed_precision) on the model as the script loaded it: fp32 by from_pretrained's default,
    so autocast on fp32 weights. LLaVA's train.py loads the language model in bf16 when --bf16
    (from_pretrained(torch_dtype=torch.bfloat16 if training_args.bf16 else None)) and casts the
    vision tower to it, so there --bf16 without DeepSpeed steps bf16 weights: pure bf16."""
    bf16, fp16 = r.boolean("bf16"), r.boolean("fp16")
    if bf16 and fp16:
        r.bad("fp16", "--bf16 and --fp16 are both set", "TrainingArguments refuses both: keep one")
        return {}
    precision = "bf16-mixed" if bf16 else "fp16-mixed" if fp16 else "fp32"
    if precision == "fp32" or "deepspeed" in r.flags:
        return {"precision": precision}
    if bf16 and "llava/train/" in command.entry.replace("\\", "/"):
        notes.append(
            "note: --bf16 without --deepspeed: LLaVA's train.py loads the model in bf16, so the optimizer steps bf16 weights "
            "(precision bf16-true; the projector, built after loading, is counted in bf16 too)"
        )
        return {"precision": "bf16"}
    return {"precision": precision}  # NB: resolve realizes it as autocast unless DeepSpeed or FSDP is stated


def _optimizer_flag(r: _Reader, notes: list[str]) -> dict[str, Any]:
    name = r.text("optim")
    if name is None:
        if "optim" not in r.flags:
            notes.append(
                "note: no --optim: AdamW foreach (adamw_torch, transformers' default before torch 2.8; newer ones default to adamw_torch_fused: pass --optim to say)"
            )
        return {}
    if name not in OPTIM:
        r.bad("optim", f"optimizer {name!r} is not modelled yet", f"modelled: {', '.join(OPTIM)}", "E813")
        return {}
    out = dict(OPTIM[name])
    decay = r.number("weight_decay")
    if out["type"] == "sgd" and decay:
        # NB: only the Trainer's first group decays (param_groups trainer, _param_groups):
        # SGD's foreach weight-decay copy is that group's gradients
        out["weight_decay"] = decay
    return {"optimizer": out}


def _param_groups(command: Command, notes: list[str]) -> dict[str, Any]:
    """HF Trainer always builds two parameter groups (transformers/trainer.py,
    Trainer.create_optimizer): weights with --weight_decay, then biases and norm weights
    without. LLaVA's LLaVATrainer.create_optimizer (llava/train/llava_trainer.py) leaves
    only biases and LayerNorm parameters out of the decay group, so its RMSNorm weights
    decay: memspec's Trainer rule would put them in the smaller group and under-state the
    larger group's foreach temporaries; one group (every tensor) bounds it from above."""
    if "llava/train/" in command.entry.replace("\\", "/"):
        notes.append(
            "note: LLaVA's trainer groups parameters by its own rule (RMSNorm weights decay): estimated with one "
            "parameter group, an upper bound of its step temporaries (biases and LayerNorm parameters, a few MB at most)"
        )
        return {}
    return {"param_groups": "trainer"}


def _trainable_flags(r: _Reader, modules: Mapping[str, Any]) -> dict[str, Any]:
    """LLaVA's train.py: the vision tower is frozen; --tune_mm_mlp_adapter trains the
    projector only; --freeze_backbone freezes the language model; LoRA adapts it."""
    names = list(modules)
    trainable = [m for m in names if not ("vision_tower" in r.flags and m == "vision")]
    if r.boolean("unfreeze_mm_vision_tower"):
        trainable = list(names)
    if r.boolean("tune_mm_mlp_adapter"):
        trainable = [m for m in names if m == "projector"]
    if r.boolean("freeze_backbone"):
        trainable = [m for m in trainable if m != "language"]
    if r.boolean("freeze_mm_mlp_adapter"):
        trainable = [m for m in trainable if m != "projector"]
    out: dict[str, Any] = {"trainable": trainable}
    if r.boolean("lora_enable"):
        lora = dict(LLAVA_LORA_DEFAULTS)
        for key, value in (("r", r.integer("lora_r")), ("alpha", r.number("lora_alpha")), ("dropout", r.number("lora_dropout")), ("bias", r.text("lora_bias"))):
            if value is not None:
                lora[key] = int(value) if key == "alpha" and float(value).is_integer() else value
        # NB: LLaVA's find_all_linear_names: every linear outside the vision tower and projector
        out["lora"] = {**lora, "target_modules": "all-linear", "modules": ["language"]}
        if lora["bias"] == "all":
            # NB: train.py calls get_peft_model before initialize_vision_modules builds the
            # vision tower and projector, so bias='all' reaches the language model only, where
            # every linear is adapted (all-linear) and the norms are RMSNorms without bias:
            # exactly the adapted layers' biases, peft's 'lora_only'
            out["lora"]["bias"] = "lora_only"
    elif r.boolean("use_peft"):
        out["lora"] = _trl_lora(r, modules)
    for name in ("lora_target_modules", "lora_modules_to_save"):
        if name in r.flags and "lora" not in out:
            r.bad(name, f"--{name} without LoRA", "TRL reads it with --use_peft only: add --use_peft, or drop the flag", "E812")
    return out


def _trl_lora(r: _Reader, modules: Mapping[str, Any]) -> dict[str, Any]:
    """TRL's ModelConfig LoRA flags (--use_peft, --lora_r, --lora_alpha, --lora_dropout,
    --lora_target_modules, --lora_modules_to_save) as get_peft_config turns them into a
    LoraConfig; peft matches the targets over the whole model, so every module may be adapted."""
    lora: dict[str, Any] = dict(TRL_LORA_DEFAULTS)
    for key, value in (("r", r.integer("lora_r")), ("alpha", r.number("lora_alpha")), ("dropout", r.number("lora_dropout"))):
        if value is not None:
            lora[key] = int(value) if key == "alpha" and float(value).is_integer() else value
    targets = r.text("lora_target_modules")
    if targets is not None:
        words = targets.split()
        lora["target_modules"] = "all-linear" if words == ["all-linear"] else words
    else:
        plain = [m for m in modules.values() if m.get("type") == "llama_causal_lm" and not m.get("inputs", {}).get("fused")]
        if len(plain) != len(modules):
            r.bad(
                "use_peft",
                "--use_peft without --lora_target_modules: peft picks target modules by model type, which memspec knows for Llama-style causal LMs only",
                "give --lora_target_modules, e.g. --lora_target_modules all-linear",
                "E812",
            )
        lora["target_modules"] = list(PEFT_DEFAULT_TARGETS)
    saves = r.text("lora_modules_to_save")
    if saves is not None:
        lora["modules_to_save"] = saves.split()
    lora["modules"] = list(modules)
    return lora


def _llava_checks(r: _Reader, modules: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """LLaVA flags that must agree with the model spec (memspec models the spec's layers)."""
    projector = r.text("mm_projector_type")
    if projector is not None:
        want = LLAVA_PROJECTORS.get(projector)
        have = modules.get("projector", {}).get("type")
        if want is None or have != want:
            r.bad(
                "mm_projector_type",
                f"projector {projector!r} is not the model spec's ({have or 'none'})",
                "modelled: mlp2x_gelu (mlp_projector); use a spec with this projector",
                "E813",
            )
    ratio = r.text("image_aspect_ratio")
    if ratio is not None and ratio not in LLAVA_ASPECT_RATIOS:
        r.bad(
            "image_aspect_ratio",
            f"image_aspect_ratio {ratio!r} is not modelled yet (several crops per image)",
            f"modelled: {', '.join(LLAVA_ASPECT_RATIOS)} (one image of the tower's size)",
            "E813",
        )
    layer = r.integer("mm_vision_select_layer", minimum=-(1 << 30))
    have_layer = modules.get("vision", {}).get("inputs", {}).get("feature_layer")
    if layer is not None and have_layer is not None and layer != have_layer:
        r.bad(
            "mm_vision_select_layer",
            f"selects layer {layer}, the model spec's vision tower feature_layer is {have_layer}",
            "use a spec whose feature_layer matches, or change the flag",
            "E813",
        )
    return {}


def config_path(reading_path: str, command: Command) -> str:
    """A file a command names (--deepspeed, --config_file): see deepspeed_path."""
    return deepspeed_path(reading_path, command)


def deepspeed_path(reading_path: str, command: Command) -> str:
    """Where a command's --deepspeed file is: as written from the working directory, else
    from the nearest folder above the script that has it (scripts run from their repo root)."""
    if Path(reading_path).is_file():
        return reading_path
    for folder in Path(command.file).resolve().parents:
        candidate = folder / reading_path
        if candidate.is_file():
            try:
                return str(candidate.relative_to(Path.cwd()))
            except ValueError:
                return str(candidate)
    return reading_path


def command_deepspeed(command: Command) -> str | None:
    """The DeepSpeed config a command names (--deepspeed, or accelerate's config file)."""
    flag = next((f for f in command.flags if f.name == "deepspeed"), None)
    if flag is not None and flag.value and not _VARIABLE.match(flag.value):
        return deepspeed_path(flag.value, command)
    if command.launcher_deepspeed:
        return deepspeed_path(command.launcher_deepspeed, command)
    if flag is not None:
        raise MemspecError(
            Diagnostic(
                "E812",
                command.file,
                flag.line,
                flag.col,
                "--deepspeed",
                f"names no file memspec can read ({flag.value!r})",
                "write the config's path, or give memspec --deepspeed FILE",
            )
        )
    return None
