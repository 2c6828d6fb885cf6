"""An accelerate config YAML (`accelerate config`, `accelerate launch --config_file`) read into
experiment overrides: distributed_type, num_processes, mixed_precision, fsdp_config (FSDP2),
deepspeed_config (its zero_stage, or the JSON file deepspeed_config_file names, read as
`--deepspeed` reads it) and dynamo_config. Returns a `deepspeed_config.Reading`; every key is
used, noted as without effect on memory, or listed as unknown; problems are raised together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..errors import Diagnostic, MemspecError
from ..pipeline.load import Document, load_yaml
from .deepspeed_config import Reading, _json_path, _offload, _unused_notes, read_deepspeed


# --------------------------------------------------------------------------- accelerate config

# accelerate/commands/config/config_args.py (ClusterConfig, BaseConfig) and
# accelerate/utils/dataclasses.py (DistributedType): the keys `accelerate config` writes.
ACCELERATE_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED")
ACCELERATE_NOT_MODELLED_TYPES = ("MULTI_CPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_HPU", "XLA", "TP", "MEGATRON_LM")
ACCELERATE_PRECISION = {"no": "fp32", "bf16": "bf16-mixed", "fp16": "fp16-mixed"}
# Keys without effect on one GPU's memory in a training step.
ACCELERATE_NO_MEMORY_EFFECT = frozenset(
    {
        "compute_environment",
        "debug",
        "machine_rank",
        "main_training_function",
        "main_process_ip",
        "main_process_port",
        "rdzv_backend",
        "same_network",
        "tpu_env",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "use_cpu",
        "enable_cpu_affinity",
        "gpu_ids",
        "downcast_bf16",
        "dynamo_config",
        "num_machines",
        "command_file",
        "commands",
        "tpu_name",
        "tpu_zone",
        "ipex_config",
        "mpirun_config",
        "fsdp_config.fsdp_state_dict_type",
        "fsdp_config.fsdp_cpu_ram_efficient_loading",
        "fsdp_config.fsdp_sync_module_states",
        "fsdp_config.fsdp_use_orig_params",
        "fsdp_config.fsdp_forward_prefetch",
        "fsdp_config.fsdp_backward_prefetch",
        "deepspeed_config.deepspeed_multinode_launcher",
        "deepspeed_config.gradient_accumulation_steps",
        "deepspeed_config.zero3_init_flag",
        "deepspeed_config.zero3_save_16bit_model",
        "deepspeed_config.gradient_clipping",
        "deepspeed_config.deepspeed_hostfile",
        "deepspeed_config.deepspeed_exclusion_filter",
        "deepspeed_config.deepspeed_inclusion_filter",
    }
)
ACCELERATE_USED = frozenset(
    {
        "distributed_type",
        "num_processes",
        "mixed_precision",
        "fsdp_config.fsdp_version",
        "fsdp_config.fsdp_reshard_after_forward",
        "fsdp_config.fsdp_auto_wrap_policy",
        "fsdp_config.fsdp_offload_params",
        "fsdp_config.fsdp_activation_checkpointing",
        "fsdp_config.fsdp_sharding_strategy",
        "deepspeed_config.zero_stage",
        "deepspeed_config.offload_optimizer_device",
        "deepspeed_config.offload_param_device",
        "deepspeed_config.deepspeed_config_file",
        "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
    }
)
ACCELERATE_DOCS = "see https://huggingface.co/docs/accelerate/usage_guides/fsdp and .../deepspeed"


def _accelerate_flat(data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("fsdp_config", "deepspeed_config", "dynamo_config") and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def read_accelerate(path: str, modules: tuple[str, ...] = ()) -> Reading:
    """An accelerate config (`accelerate config` / `--config_file`) as overrides.

    distributed_type picks the sharding: NO (one process), MULTI_GPU (DDP), FSDP (FSDP2 with
    fsdp_version 2), DEEPSPEED (its zero_stage, or the JSON file deepspeed_config_file names,
    read as --deepspeed reads it); num_processes counts the processes of every machine, so it
    is dp; mixed_precision bf16/fp16/no. fsdp_activation_checkpointing checkpoints the
    wrapped layers of `modules`. Every key is either used, known to have no effect on
    memory (a note), or listed as unknown (a warning).
    """
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise MemspecError(doc.diag("E804", "$", "an accelerate config is a mapping of keys", ACCELERATE_DOCS))
    flat = _accelerate_flat(doc.data)
    problems: list[Diagnostic] = []
    out: dict[str, Any] = {}
    notes: list[str] = []

    def where(key: str) -> str:
        return _json_path(key)

    def bad(key: str, message: str, help: str, code: str = "E804") -> None:
        problems.append(doc.diag(code, where(key), message, help))

    kind = flat.get("distributed_type", "NO")
    if not isinstance(kind, str):
        bad("distributed_type", f"unknown distributed_type {kind!r}", f"one of {', '.join(ACCELERATE_TYPES)} (accelerate's DistributedType)")
    elif kind in ACCELERATE_NOT_MODELLED_TYPES:
        bad("distributed_type", f"distributed_type {kind} is not modelled", f"modelled: {', '.join(ACCELERATE_TYPES)}", "E805")
    elif kind not in ACCELERATE_TYPES:
        bad("distributed_type", f"unknown distributed_type {kind!r}", f"one of {', '.join(ACCELERATE_TYPES)} (accelerate's DistributedType)")
    n = flat.get("num_processes", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        bad("num_processes", f"expected a positive number of processes, got {n!r}", "write num_processes: 8 (all machines together)")
    else:
        out["dp"] = 1 if kind == "NO" else n
    mp = flat.get("mixed_precision", "no")
    if not isinstance(mp, str):
        bad("mixed_precision", f"expected mixed_precision no, bf16 or fp16, got {mp!r}", "write no, bf16 or fp16 (accelerate's PrecisionType)")
    elif mp not in ACCELERATE_PRECISION:
        bad("mixed_precision", f"mixed_precision {mp!r} is not modelled", "write no, bf16 or fp16 (fp8 is not modelled)", "E805" if mp == "fp8" else "E804")
    elif "mixed_precision" in flat:
        out["precision"] = ACCELERATE_PRECISION[mp]
    backend = flat.get("dynamo_config.dynamo_backend", "NO")
    if str(backend).upper() != "NO":
        # NB: accelerate compiles the prepared model with torch.compile(backend=...): the
        # compiled step's saved activations are not the eager step's, and none is measured
        bad(
            "dynamo_config.dynamo_backend",
            f"dynamo_backend {backend}: torch.compile changes which activations are saved, and a compiled step is not modelled",
            "write dynamo_backend: 'NO' to estimate the eager step",
            "E805",
        )
    if kind == "FSDP":
        out.update(_accelerate_fsdp(flat, bad, modules, notes))
    elif kind == "DEEPSPEED":
        out["fsdp"] = None
        out.update(_accelerate_deepspeed(flat, bad, doc, notes))
    else:
        # NB: DDP (MULTI_GPU) or one process shards nothing; its mixed precision (the config's
        # mixed_precision, or the script's --bf16 / --fp16) is torch.autocast around the forward
        # of the model as loaded (accelerate's Accelerator.autocast), not DeepSpeed's masters
        out.update({"fsdp": None, "zero": 0, "precision_mode": "autocast"})
    if problems:
        raise MemspecError(problems)
    rest = [k for k in flat if k not in ACCELERATE_USED and not k.startswith("dynamo_config.")]
    no_effect = [k for k in rest if k in ACCELERATE_NO_MEMORY_EFFECT]
    unknown = [k for k in rest if k not in ACCELERATE_NO_MEMORY_EFFECT]
    for section, used_by in (("fsdp_config", "FSDP"), ("deepspeed_config", "DEEPSPEED")):
        if kind != used_by and any(k.startswith(section + ".") for k in flat):
            notes.append(f"note: {path}: {section} is not used: distributed_type is {kind}")
    notes += _unused_notes(path, no_effect, [], unknown)
    return Reading(out, tuple(notes))


def _accelerate_fsdp(flat: Mapping[str, Any], bad, modules: tuple[str, ...], notes: list[str]) -> dict[str, Any]:
    """fsdp_config: FSDP2 only (accelerate's fsdp_version 2 calls fully_shard)."""
    out: dict[str, Any] = {}
    version = flat.get("fsdp_config.fsdp_version", 1)
    if version != 2:
        bad(
            "fsdp_config.fsdp_version" if "fsdp_config.fsdp_version" in flat else "fsdp_config",
            f"FSDP version {version!r} (FullyShardedDataParallel, flat parameters) is not modelled",
            "write fsdp_version: 2 (fully_shard); accelerate's default is 1",
            "E805",
        )
    wrap = flat.get("fsdp_config.fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    if wrap != "TRANSFORMER_BASED_WRAP":
        bad(
            "fsdp_config.fsdp_auto_wrap_policy",
            f"auto wrap policy {wrap!r} is not modelled",
            "modelled: TRANSFORMER_BASED_WRAP (each layer in the model's _no_split_modules a unit)",
            "E805",
        )
    if flat.get("fsdp_config.fsdp_offload_params") is True:
        bad(
            "fsdp_config.fsdp_offload_params",
            "FSDP2 CPU offload (CPUOffloadPolicy) is not modelled yet",
            "set fsdp_offload_params: false to estimate with parameters, gradients and optimizer states on the GPU",
            "E805",
        )
    block: dict[str, Any] = {}
    reshard = flat.get("fsdp_config.fsdp_reshard_after_forward")
    if reshard is None and "fsdp_config.fsdp_sharding_strategy" in flat:
        # NB: FSDP1-style strategy names; accelerate maps them onto reshard_after_forward for FSDP2
        strategy = flat["fsdp_config.fsdp_sharding_strategy"]
        reshard = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}.get(strategy, strategy)
    if reshard is not None:
        if isinstance(reshard, bool):
            block["reshard_after_forward"] = reshard
        else:
            bad("fsdp_config.fsdp_reshard_after_forward", f"expected true or false, got {reshard!r}", "write fsdp_reshard_after_forward: true")
    checkpointing = flat.get("fsdp_config.fsdp_activation_checkpointing")
    if checkpointing is not None and not isinstance(checkpointing, bool):
        bad("fsdp_config.fsdp_activation_checkpointing", f"expected true or false, got {checkpointing!r}", "write fsdp_activation_checkpointing: true")
    elif checkpointing is not None:
        # NB: accelerate wraps every auto-wrapped layer in checkpoint_wrapper; a module no
        # gradient reaches recomputes nothing
        out["gradient_checkpointing"] = list(modules) if checkpointing else []
    if "fsdp_config.fsdp_transformer_layer_cls_to_wrap" in flat:
        notes.append(
            f"note: fsdp_transformer_layer_cls_to_wrap {flat['fsdp_config.fsdp_transformer_layer_cls_to_wrap']}: the units are taken as the model's decoder and encoder layers (its _no_split_modules), each one unit, and the root"
        )
    notes.append(
        "note: FSDP2 gradients are estimated reduced in fp32 (MixedPrecisionPolicy reduce_dtype); pass --fsdp-reduce-dtype bf16 if your policy reduces in bf16"
    )
    out["fsdp"] = block
    out["zero"] = 0
    return out


def _accelerate_deepspeed(flat: Mapping[str, Any], bad, doc: Document, notes: list[str]) -> dict[str, Any]:
    """deepspeed_config: a JSON file (read as --deepspeed reads it) or the inline keys."""
    file = flat.get("deepspeed_config.deepspeed_config_file")
    if file not in (None, "", "none"):
        target = Path(file)
        if not target.is_absolute() and not target.is_file():
            target = Path(doc.file).parent / file
        if not target.is_file():
            bad("deepspeed_config.deepspeed_config_file", f"DeepSpeed config {file!r} not found", f"looked for {target.resolve()}", "E101")
            return {}
        reading = read_deepspeed(str(target))
        notes.append(f"note: DeepSpeed config {target}")
        notes.extend(reading.notes)
        return dict(reading.overrides)
    stage = flat.get("deepspeed_config.zero_stage", 0)
    out: dict[str, Any] = {}
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        bad("deepspeed_config.zero_stage", f"expected a ZeRO stage 0, 1, 2 or 3, got {stage!r}", "write zero_stage: 2")
    else:
        out["deepspeed"] = {"zero": stage}
    for key in ("offload_optimizer_device", "offload_param_device"):
        device = flat.get("deepspeed_config." + key, "none")
        dotted = "deepspeed_config." + key
        found = _offload(
            device,
            dotted,
            lambda k, m, h, c="E801", d=dotted: bad(d, m, h, "E804" if c == "E801" else c),
            stage if "deepspeed" in out else 0,
            key == "offload_optimizer_device",
        )
        if found:
            out["deepspeed"][key.removesuffix("_device")] = found
    if "deepspeed" in out and out["deepspeed"].get("offload_param") and not out["deepspeed"].get("offload_optimizer"):
        bad(
            "deepspeed_config.offload_param_device",
            "parameter offload without optimizer offload",
            "DeepSpeed refuses it (stage3.py, DeepSpeedZeroOptimizer_Stage3._configure_offloading); set offload_optimizer_device: cpu",
            "E807",
        )
    return out
