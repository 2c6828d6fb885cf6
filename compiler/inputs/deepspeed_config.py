"""A DeepSpeed JSON config read into experiment overrides.

Contract: `read_deepspeed(path, explicit)` reads a DeepSpeed config (JSON, loaded with the
position-tracking YAML loader, so every error has its line:col) into experiment overrides.
`"auto"` is resolved as HF Trainer resolves it (transformers/integrations/deepspeed.py):
bf16/fp16 and the micro-batch follow the training arguments, so they are left to the
experiment here, and bucket sizes follow the spec's hidden_size in `resolve`. It returns a
`Reading`: the overrides (experiment keys, as `resolve_setup` takes them) and the notes a user
must see (keys not used, assumptions, warnings); nothing is dropped without a note. Problems
are raised together as one `MemspecError`; nothing prints. The launch command and accelerate
readers (`launch.py`, `accelerate.py`) return the same `Reading`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError
from ..pipeline.load import Document, child_path, load_yaml


@dataclass(frozen=True)
class Reading:
    overrides: Mapping[str, Any]
    notes: tuple[str, ...] = ()  # "note: ..." / "warning: ..." lines, in order


# --------------------------------------------------------------------------- DeepSpeed JSON

# DeepSpeed's config keys (deepspeed/runtime/config.py, zero/config.py) that the estimate
# does not read, by why. Anything else outside the keys read is reported as unknown.
DS_NO_MEMORY_EFFECT = frozenset(
    {
        "train_batch_size",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "steps_per_print",
        "wall_clock_breakdown",
        "prescale_gradients",
        "gradient_predivide_factor",
        "scheduler",
        "dump_state",
        "flops_profiler",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comms_logger",
        "zero_allow_untested_optimizer",
        "fp16.loss_scale",
        "fp16.loss_scale_window",
        "fp16.initial_scale_power",
        "fp16.hysteresis",
        "fp16.min_loss_scale",
        "fp16.consecutive_hysteresis",
        "fp16.auto_cast",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "zero_optimization.stage3_gather_fp16_weights_on_model_save",
        "zero_optimization.gather_16bit_weights_on_model_save",
        "zero_optimization.reduce_scatter",
        "zero_optimization.allgather_partitions",
        "zero_optimization.round_robin_gradients",
        "zero_optimization.load_from_fp32_weights",
        # NVMe offload's asynchronous I/O settings: its buffers are pinned host memory
        # (deepspeed/runtime/swap_tensor/partitioned_param_swapper.py, AsyncPartitionedParameterSwapper._configure_aio)
        "aio",
    }
)
# Keys that change memory a little and are not modelled yet (a warning, not an error).
DS_NOT_MODELLED = frozenset(
    {
        "optimizer",
        "activation_checkpointing",
        "zero_optimization.allgather_bucket_size",
        "zero_optimization.stage3_model_persistence_threshold",
        "zero_optimization.elastic_checkpoint",
        "zero_optimization.zero_hpz_partition_size",
        "zero_optimization.zero_quantized_weights",
        "zero_optimization.zero_quantized_gradients",
    }
)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
COMM_DTYPES = ("fp32", "fp16", "bf16")
# DeepSpeed accepts "bfloat16" as another name for the "bf16" section (runtime/config.py).
BF16_SECTIONS = ("bf16", "bfloat16")
# DeepSpeed's element counts the estimate reads -> the experiment's `parallel` key; the first
# three take HF Trainer's "auto" (sized from hidden_size in `resolve`).
BUCKET_KEYS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "sub_group_size": "sub_group_size",
}
AUTO_KEYS = frozenset({"reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"})


def _flatten(data: Mapping[str, Any], path: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value; the sections DeepSpeed nests are walked, others kept whole."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else key
        nested = dotted in ("zero_optimization", "fp16", *BF16_SECTIONS) and isinstance(value, dict)
        out.update(_flatten(value, dotted) if nested else {dotted: value})
    return out


def _json_path(dotted: str) -> str:
    path = "$"
    for part in dotted.split("."):
        path = child_path(path, part)
    return path


def _elements(value: Any) -> int | None:
    """A bucket size as DeepSpeed's pydantic config takes it: an int, or a float with an
    integral value (5e8); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return None


def _strict_json(path: str) -> None:
    """DeepSpeed reads its config with json.load (deepspeed/runtime/config.py,
    DeepSpeedConfig.__init__), which refuses what YAML would accept (a trailing comma,
    comments, single quotes): such a file is an error here too, at its line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return  # NB: load_yaml reports an unreadable file with its own code
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise MemspecError(
            Diagnostic(
                "E801",
                path,
                exc.lineno,
                exc.colno,
                "",
                f"not valid JSON: {exc.msg}",
                "DeepSpeed reads the config with json.load: no trailing commas, comments or single quotes",
            )
        ) from None


def read_deepspeed(path: str, explicit: Mapping[str, Any] | None = None) -> Reading:
    """A DeepSpeed config as overrides. `explicit` holds the training arguments a launch
    command gave (micro_batch, precision): a number in the config that disagrees with one is
    an error, as HF Trainer refuses the mismatch."""
    _strict_json(path)
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise MemspecError(doc.diag("E801", "$", "a DeepSpeed config is a JSON object", "see https://www.deepspeed.ai/docs/config-json/"))
    flat = _flatten(doc.data)
    problems: list[Diagnostic] = []
    out: dict[str, Any] = {}

    def bad(key: str, message: str, help: str, code: str = "E801") -> None:
        problems.append(doc.diag(code, _json_path(key), message, help))

    used: set[str] = set()
    ds = _zero_optimization(flat, used, bad)
    precision, seen = _precision(flat, used, bad)
    if precision:
        out["precision"] = precision
    if "train_micro_batch_size_per_gpu" in flat:
        used.add("train_micro_batch_size_per_gpu")
        mb = flat["train_micro_batch_size_per_gpu"]
        if mb != "auto":
            if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
                bad(
                    "train_micro_batch_size_per_gpu",
                    f'expected a positive integer or "auto", got {mb!r}',
                    'write "auto" to follow --per_device_train_batch_size, or a number',
                )
            else:
                out["micro_batch"] = mb
    problems += _mismatches(doc, out, explicit or {})
    if problems:
        raise MemspecError(problems)
    out["deepspeed"] = ds
    return Reading(out, _ds_notes(path, flat, used | seen))


def _zero_optimization(flat: Mapping[str, Any], used: set[str], bad) -> dict[str, Any]:
    """The config's DeepSpeed keys the estimate reads (the ZeRO stage, its overlap, buckets and
    offloads, the communication dtype), each key read added to `used`, problems to `bad`."""
    ds: dict[str, Any] = {}
    # NB: the config replaces the experiment's DeepSpeed keys as a whole; without a stage,
    # DeepSpeed's default, 0 (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig.stage)
    stage = flat.get("zero_optimization.stage", 0)
    ds["zero"] = 0
    if "zero_optimization.stage" in flat:
        used.add("zero_optimization.stage")
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            bad("zero_optimization.stage", f"expected a ZeRO stage 0, 1, 2 or 3, got {stage!r}", 'write "stage": 2 (an integer, unquoted)')
        else:
            ds["zero"] = stage
    for key in ("overlap_comm", "contiguous_gradients"):
        dotted = "zero_optimization." + key
        if dotted in flat:
            used.add(dotted)
            if isinstance(flat[dotted], bool):
                ds[key] = flat[dotted]
            else:
                bad(dotted, f"expected true or false, got {flat[dotted]!r}", f'write "{key}": true (unquoted)')
    for key, name in BUCKET_KEYS.items():
        dotted = "zero_optimization." + key
        if dotted in flat:
            used.add(dotted)
            value = flat[dotted]
            n = _elements(value)
            if value == "auto" and key in AUTO_KEYS:
                ds[name] = "auto"
            elif n is None or n < 0:
                auto = ', or "auto" for HF Trainer\'s size from hidden_size' if key in AUTO_KEYS else ""
                expected = 'a number of elements or "auto"' if auto else "a number of elements"
                bad(dotted, f"expected {expected}, got {value!r}", f'write "{key}": 5e8 (or 500000000){auto}')
            else:
                ds[name] = n
    for key in ("offload_optimizer", "offload_param"):
        dotted = "zero_optimization." + key
        if dotted in flat:
            used.add(dotted)
            device = _offload(flat[dotted], dotted, bad, ds.get("zero", 0), key == "offload_optimizer")
            if device:
                ds[key] = device
    if ds.get("offload_param") and not ds.get("offload_optimizer"):
        bad(
            "zero_optimization.offload_param",
            "parameter offload without optimizer offload",
            'DeepSpeed refuses it (stage3.py, DeepSpeedZeroOptimizer_Stage3._configure_offloading: "parameter offload is only '
            'available with optimizer state offload"); add "offload_optimizer": {"device": "cpu"}',
            "E807",
        )
    if "communication_data_type" in flat:
        used.add("communication_data_type")
        value = flat["communication_data_type"]
        # NB: deepspeed/runtime/config.py, get_communication_data_type: fp32, fp16 or bf16, any case
        if isinstance(value, str) and value.lower() in COMM_DTYPES:
            ds["communication_data_type"] = value.lower()
        elif value is not None:
            bad(
                "communication_data_type",
                f"expected one of {', '.join(COMM_DTYPES)}, got {value!r}",
                'write "communication_data_type": "fp32", or leave it out to reduce gradients in their own dtype',
            )
    return ds


def _offload(value: Any, dotted: str, bad, stage: int, optimizer: bool) -> str | None:
    """The device of an offload the estimate models, else None (nothing offloaded, or a problem
    reported through `bad`). Modelled: the optimizer to the CPU under ZeRO-1/2
    (deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer with cpu_offload); under
    ZeRO-3 the optimizer and the parameters to the CPU or NVMe (deepspeed/runtime/zero/stage3.py,
    DeepSpeedZeroOptimizer_Stage3; NVMe only through the ZeRO-3 swappers, swap_tensor/)."""
    device = value.get("device", "none") if isinstance(value, dict) else value
    if device is None or device == "none":
        return None
    where = dotted + (".device" if isinstance(value, dict) else "")
    if device not in OFFLOAD_DEVICES:
        bad(where, f"expected one of {', '.join(OFFLOAD_DEVICES)}, got {device!r}", 'write "device": "cpu", or "none"')
        return None
    if stage == 3 or (optimizer and device == "cpu" and stage in (1, 2)):
        return device
    what = "optimizer states" if optimizer else "parameters"
    modelled = "modelled: offload_optimizer to cpu with ZeRO stage 1 or 2; offload_optimizer and offload_param to cpu or nvme with ZeRO stage 3"
    why = (
        "DeepSpeed offloads to NVMe only with ZeRO-3 (docs/_pages/config-json.md, offload_optimizer; stage_1_and_2.py has no swapper)"
        if device == "nvme" and stage in (1, 2) and optimizer
        else "parameter offload is a ZeRO-3 feature"
        if not optimizer
        else "ZeRO-0 has no optimizer partition to offload"
    )
    bad(
        where,
        f"offloading {what} to {device} under ZeRO-{stage} is not modelled: {why}",
        f'{modelled}; remove {dotted.split(".")[-1]} (or set "device": "none") to estimate with everything on the GPU',
        "E802",
    )
    return None


def _precision(flat: Mapping[str, Any], used: set, bad) -> tuple[str | None, set]:
    """The precision the config sets: None for "auto" or unset (the training arguments')."""
    seen, enabled = set(), {}
    for section in ("fp16", *BF16_SECTIONS):
        key = section + ".enabled"
        if key not in flat:
            continue
        seen.add(key)
        value = flat[key]
        if value != "auto" and not isinstance(value, bool):
            bad(key, f'expected true, false or "auto", got {value!r}', 'write "enabled": "auto" to follow --bf16 / --fp16')
            continue
        enabled["fp16" if section == "fp16" else "bf16"] = value
    if enabled.get("fp16") is True and enabled.get("bf16") is True:
        bad("bf16.enabled" if "bf16.enabled" in flat else "bfloat16.enabled", "bf16 and fp16 are both enabled", "DeepSpeed refuses both: enable one")
        return None, seen
    if enabled.get("bf16") is True:
        return "bf16-mixed", seen
    if enabled.get("fp16") is True:
        return "fp16-mixed", seen
    if enabled.get("fp16") is False and enabled.get("bf16") is False:
        return "fp32", seen
    return None, seen


def _mismatches(doc: Document, found: Mapping[str, Any], explicit: Mapping[str, Any]) -> list[Diagnostic]:
    """A number in the config against the launch command's own (HF's fill_match refuses)."""
    out = []
    for key, json_key, flag in (
        ("micro_batch", "train_micro_batch_size_per_gpu", "--per_device_train_batch_size"),
        ("precision", "bf16.enabled", "--bf16/--fp16"),
    ):
        if key in found and key in explicit and found[key] != explicit[key]:
            path = _json_path(json_key) if json_key in doc.data or key == "micro_batch" else "$"
            out.append(
                doc.diag(
                    "E803",
                    path,
                    f"the config says {key.replace('_', '-')} {found[key]}, the command line {flag} says {explicit[key]}",
                    'HF Trainer refuses the mismatch: write "auto" in the config, or make them agree',
                )
            )
    return out


def _ds_notes(path: str, flat: Mapping[str, Any], used: set) -> tuple[str, ...]:
    rest = [k for k in flat if k not in used]
    top = lambda k: k.split(".")[0] if k.split(".")[0] in DS_NOT_MODELLED else k  # noqa: E731
    not_modelled = [k for k in rest if top(k) in DS_NOT_MODELLED]
    no_effect = [k for k in rest if k in DS_NO_MEMORY_EFFECT or k.split(".")[0] in DS_NO_MEMORY_EFFECT]
    unknown = [k for k in rest if k not in not_modelled and k not in no_effect]
    return tuple(_unused_notes(path, no_effect, not_modelled, unknown))


def _unused_notes(path: str, no_effect: list[str], not_modelled: list[str], unknown: list[str]) -> list[str]:
    """The lines that list a config file's keys the estimate does not use, by reason."""
    notes = []
    if no_effect:
        notes.append(f"note: {path}: not used (no effect on memory): {', '.join(no_effect)}")
    if not_modelled:
        notes.append(f"warning: {path}: not modelled (small effects assumed absent): {', '.join(not_modelled)}")
    if unknown:
        notes.append(f"warning: {path}: unknown keys, not used: {', '.join(unknown)}")
    return notes
