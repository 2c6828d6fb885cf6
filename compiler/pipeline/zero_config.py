"""DeepSpeed ZeRO as an estimate reads it: the buffers the engine allocates and their sizes.

Contract: `deepspeed_buffers(parallel, hidden_size)` turns an experiment's `parallel` block
into a `DeepSpeed` (bucket sizes, prefetch and persistence limits, offload devices, the
communication dtype), DeepSpeed's defaults filled and HF Trainer's "auto" sizes computed
from the hidden size, or a problem; `offload_problem` is what DeepSpeed refuses in the
offload settings; `deepspeed_constants` lists the sizes and assumptions an estimate used.
The named constants here, each with its source, are what the ZeRO walks
(`walks/zero12.py`, `walks/zero3.py`, `walks/deepspeed.py`) size their buffers by. Part of
stage 3 (resolve), which re-exports all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .gpus import Constant


@dataclass(frozen=True)
class DeepSpeed:
    """The ZeRO buffers the engine allocates besides the sharded states (elements)."""

    reduce_bucket: int  # zero_optimization.reduce_bucket_size
    prefetch_bucket: int  # stage3_prefetch_bucket_size
    overlap_comm: bool
    contiguous_gradients: bool
    offload_optimizer: str = "none"  # zero_optimization.offload_optimizer.device: none | cpu (ZeRO-1/2/3) | nvme (ZeRO-3)
    offload_param: str = "none"  # zero_optimization.offload_param.device: none | cpu | nvme (ZeRO-3, with offload_optimizer)
    persistence_threshold: int = 100_000  # stage3_param_persistence_threshold: parameters below it stay whole
    max_live_parameters: int = 1_000_000_000  # stage3_max_live_parameters: caps what the prefetcher gathers
    max_reuse_distance: int = 1_000_000_000  # stage3_max_reuse_distance: a parameter used again within it stays gathered
    sub_group_size: int = 1_000_000_000  # sub_group_size: ZeRO-3 steps the optimizer one sub-group at a time
    comm_bytes: int | None = None  # communication_data_type's element size; None: the gradients' dtype


# deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig, deepspeedai/DeepSpeed at 1b88ac36):
# reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7, stage3_param_persistence_threshold
# 1e5, stage3_max_live_parameters 1e9, stage3_max_reuse_distance 1e9, sub_group_size 1e9,
# contiguous_gradients True, overlap_comm False except for stage 3 (overlap_comm_valid).
DEEPSPEED_DEFAULT_REDUCE_BUCKET = 500_000_000
DEEPSPEED_DEFAULT_PREFETCH_BUCKET = 50_000_000
DEEPSPEED_DEFAULT_PERSISTENCE = 100_000
DEEPSPEED_DEFAULT_MAX_LIVE = 1_000_000_000
DEEPSPEED_DEFAULT_REUSE_DISTANCE = 1_000_000_000
DEEPSPEED_DEFAULT_SUB_GROUP = 1_000_000_000
# transformers/integrations/deepspeed.py (HfTrainerDeepSpeedConfig.trainer_config_finalize):
# "auto" sizes from the model's hidden size h: reduce_bucket_size h^2,
# stage3_prefetch_bucket_size int(0.9 h^2), stage3_param_persistence_threshold 10 h.
HF_AUTO_PREFETCH_FRACTION = 0.9
HF_AUTO_PERSISTENCE_FACTOR = 10
# When ZeRO creates the optimizer's states (Adam's exp_avg / exp_avg_sq of the fp32 partition).
# Up to DeepSpeed 0.13 every ZeRO stage ran one optimizer step at engine initialization on zero
# gradients (stage3.py, DeepSpeedZeroOptimizer_Stage3.initialize_optimizer_states calls
# self._optimizer_step(i) per sub-group, microsoft/DeepSpeed at 0003660d; stage_1_and_2.py
# likewise), so the states exist before the first forward. At 02aa38c3 stage_1_and_2.py's
# DeepSpeedZeroOptimizer.initialize_optimizer_states makes a zero fp32 gradient per group and
# sets it back to None without stepping: lazy under ZeRO-1/2 as well. deepspeedai/DeepSpeed PR #5104
# ("Remove optimizer step on initialization", 2024-02) made them lazy: initialize_optimizer_states
# at 007cca6a only sizes a zero gradient buffer and steps nothing, so torch's Adam creates the
# states in the first step(). The fp32 master partition (_create_fp32_partitions) and, under
# ZeRO-3, the 16-bit gradient partition (grad_partitions_flat_buffer) are made at
# initialization in both. Modelled: the lazy form (the current release); a run on DeepSpeed
# <= 0.13 (LLaVA pins 0.12.6) has its first step equal to the steady state.
DEEPSPEED_STATES_AT_INIT = False
# deepspeed/runtime/zero/stage_1_and_2.py (deepspeedai/DeepSpeed at 02aa38c3), DeepSpeedZeroOptimizer.__init__:
# nccl_start_alignment_factor 2 ("4-byte alignment/sizeof(fp16)"); each parameter group's flat
# 16-bit buffer is padded to a multiple of 2 x dp elements (flatten_dense_tensors_aligned)
# before it is cut into dp partitions, so a rank's fp32 partition is that over dp.
ZERO12_ALIGNMENT = 2
# communication_data_type -> bytes per element (deepspeed/runtime/config.py, get_communication_data_type);
# unset, engine.communication_data_type follows the precision: fp16, bf16, else fp32.
COMM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
_AUTO_KEYS = {
    "reduce_bucket_size": lambda h: h * h,
    "prefetch_bucket_size": lambda h: int(HF_AUTO_PREFETCH_FRACTION * h * h),
    "param_persistence_threshold": lambda h: HF_AUTO_PERSISTENCE_FACTOR * h,
}


def deepspeed_buffers(parallel: Mapping[str, Any], hidden_size: int | None) -> tuple[DeepSpeed | None, tuple[str, str, str] | None]:
    """The DeepSpeed buffer sizes of a `parallel` block, or a problem: (code, message, help)."""
    problem = offload_problem(parallel)
    if problem:
        return None, problem
    if parallel["zero"] == 0:
        return None, None
    sizes = {
        "reduce_bucket_size": parallel.get("reduce_bucket_size", DEEPSPEED_DEFAULT_REDUCE_BUCKET),
        "prefetch_bucket_size": parallel.get("prefetch_bucket_size", DEEPSPEED_DEFAULT_PREFETCH_BUCKET),
        "param_persistence_threshold": parallel.get("param_persistence_threshold", DEEPSPEED_DEFAULT_PERSISTENCE),
    }
    auto = [k for k, v in sizes.items() if v == "auto"]
    if auto:
        if hidden_size is None:
            return None, (
                "E505",
                f"'auto' {', '.join(auto)} need(s) the spec's hidden_size (HF Trainer fills them from it)",
                "write the sizes as numbers, or add hidden_size to the model spec",
            )
        sizes.update({k: _AUTO_KEYS[k](hidden_size) for k in auto})
    overlap = parallel.get("overlap_comm", parallel["zero"] == 3)
    return DeepSpeed(
        int(sizes["reduce_bucket_size"]),
        int(sizes["prefetch_bucket_size"]),
        bool(overlap),
        bool(parallel.get("contiguous_gradients", True)),
        parallel.get("offload_optimizer", "none"),
        parallel.get("offload_param", "none"),
        int(sizes["param_persistence_threshold"]),
        int(parallel.get("max_live_parameters", DEEPSPEED_DEFAULT_MAX_LIVE)),
        int(parallel.get("max_reuse_distance", DEEPSPEED_DEFAULT_REUSE_DISTANCE)),
        int(parallel.get("sub_group_size", DEEPSPEED_DEFAULT_SUB_GROUP)),
        COMM_BYTES.get(parallel.get("communication_data_type")),
    ), None


def offload_problem(parallel: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """What DeepSpeed (or the estimate) does not allow in the offload settings of a `parallel` block.

    deepspeed/runtime/zero/stage3.py, DeepSpeedZeroOptimizer_Stage3._configure_offloading:
    parameter offload needs optimizer offload; NVMe is reached only through the ZeRO-3
    swappers (deepspeed/runtime/swap_tensor/); stage_1_and_2.py offloads to the CPU only.
    """
    zero = parallel["zero"]
    optimizer, param = parallel.get("offload_optimizer", "none"), parallel.get("offload_param", "none")
    if optimizer != "none" and zero == 0:
        return (
            "E311",
            f"offload_optimizer {optimizer} needs a ZeRO stage: ZeRO-0 has no optimizer partition to offload",
            "use zero: 1 or 2 with offload_optimizer: cpu, or zero: 3 with cpu or nvme",
        )
    if optimizer == "nvme" and zero in (1, 2):
        return (
            "E311",
            f"offload_optimizer nvme is a ZeRO-3 feature, not ZeRO-{zero} (DeepSpeed offloads to NVMe only with ZeRO-3; stage_1_and_2.py has no swapper)",
            "use offload_optimizer: cpu, or zero: 3",
        )
    if param != "none" and zero != 3:
        return (
            "E806",
            f"offload_param {param} is a ZeRO-3 feature, not ZeRO-{zero}",
            "use zero: 3, or remove offload_param (ZeRO-1/2 keep every 16-bit weight on the GPU)",
        )
    if param != "none" and optimizer == "none":
        return (
            "E807",
            f"offload_param {param} without offload_optimizer",
            'DeepSpeed refuses it (stage3.py: "parameter offload is only available with optimizer state offload"); add offload_optimizer: cpu',
        )
    return None


def deepspeed_constants(ds: DeepSpeed | None, zero: int) -> tuple[Constant, ...]:
    """The DeepSpeed sizes and assumptions an estimate used (they size what the simulator adds)."""
    if ds is None:
        return ()
    given = "the experiment's or DeepSpeed config's value, else"
    config = "deepspeed/runtime/zero/config.py"
    out = [
        Constant(
            "zero_optimization.reduce_bucket_size",
            ds.reduce_bucket,
            "elements",
            f'{given} {DEEPSPEED_DEFAULT_REDUCE_BUCKET:,} ({config}); "auto": hidden_size^2 (transformers/integrations/deepspeed.py)',
        ),
        Constant("zero_optimization.overlap_comm", str(ds.overlap_comm).lower(), "", f"{given} DeepSpeed's default: true for ZeRO-3, false below ({config})"),
        Constant("zero_optimization.contiguous_gradients", str(ds.contiguous_gradients).lower(), "", f"{given} DeepSpeed's default true ({config})"),
    ]
    if zero == 3:
        out += _zero3_constants(ds, given, config)
    if zero in (1, 2):
        out += _zero12_constants(ds, given)
    out.append(
        Constant(
            "optimizer states created",
            "at engine init" if DEEPSPEED_STATES_AT_INIT else "at the first step()",
            "",
            "DeepSpeed >= 0.14 (PR #5104, initialize_optimizer_states steps nothing); <= 0.13 stepped at "
            "initialization, so its first step equals the steady state (compiler/pipeline/resolve.py, DEEPSPEED_STATES_AT_INIT)",
        )
    )
    return tuple(out)


def _zero3_constants(ds: DeepSpeed, given: str, config: str) -> list[Constant]:
    """The ZeRO-3 sizes: prefetch, persistence, live and reuse limits, the communication dtype, sub-groups."""
    return [
        Constant(
            "zero_optimization.stage3_prefetch_bucket_size",
            ds.prefetch_bucket,
            "elements",
            f"{given} {DEEPSPEED_DEFAULT_PREFETCH_BUCKET:,} ({config}); "
            f'"auto": int({HF_AUTO_PREFETCH_FRACTION} x hidden_size^2) (transformers/integrations/deepspeed.py)',
        ),
        Constant(
            "zero_optimization.stage3_param_persistence_threshold",
            ds.persistence_threshold,
            "elements",
            f'{given} {DEEPSPEED_DEFAULT_PERSISTENCE:,} ({config}); "auto": {HF_AUTO_PERSISTENCE_FACTOR} x hidden_size '
            "(transformers/integrations/deepspeed.py); smaller parameters stay whole on every rank",
        ),
        Constant(
            "zero_optimization.stage3_max_live_parameters",
            ds.max_live_parameters,
            "elements",
            f"{given} {DEEPSPEED_DEFAULT_MAX_LIVE:,} ({config}); caps the prefetch "
            "(partitioned_param_coordinator.py, fetch_sub_module: min(max_live - available, prefetch_bucket))",
        ),
        Constant(
            "zero_optimization.stage3_max_reuse_distance",
            ds.max_reuse_distance,
            "elements",
            f"{given} {DEEPSPEED_DEFAULT_REUSE_DISTANCE:,} ({config}); a layer used again within it stays gathered "
            "(partitioned_param_coordinator.py, __params_to_release)",
        ),
        Constant(
            "communication_data_type",
            "the gradients' dtype" if ds.comm_bytes is None else f"{ds.comm_bytes} B",
            "",
            f"{given} the precision's 16-bit dtype (runtime/engine.py, communication_data_type); another makes "
            "__avg_scatter_grads convert each bucket's gradients (stage3.py)",
        ),
        Constant(
            "zero_optimization.sub_group_size",
            ds.sub_group_size,
            "elements",
            f"{given} {DEEPSPEED_DEFAULT_SUB_GROUP:,} ({config}); the step converts one sub-group's gradients to fp32 "
            "at a time (stage3.py, _prepare_fp32_grad_for_sub_group)",
        ),
    ]


def _zero12_constants(ds: DeepSpeed, given: str) -> list[Constant]:
    """The ZeRO-1/2 sizes: the communication dtype and the partition alignment."""
    return [
        Constant(
            "communication_data_type",
            "the gradients' dtype" if ds.comm_bytes is None else f"{ds.comm_bytes} B",
            "",
            f"{given} the precision's 16-bit dtype (runtime/engine.py, communication_data_type); another makes "
            "allreduce_bucket convert each flattened bucket (stage_1_and_2.py)",
        ),
        Constant(
            "ZeRO-1/2 partition alignment",
            ZERO12_ALIGNMENT,
            "elements x dp",
            "stage_1_and_2.py, nccl_start_alignment_factor: each group's flat buffer is padded to a multiple of it times dp before it is cut into partitions",
        ),
    ]
