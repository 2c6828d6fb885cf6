"""The context a formula's expressions read besides its inputs: the training setup's names
(compiler.library.formula CONTEXT lists them) for one module's layers."""

from __future__ import annotations

from typing import Any

from .resolve import Setup

# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (torch 2.11): `check_prefer_cudnn_attention`
# puts cuDNN attention before the flash and memory-efficient kernels on compute capability 9.x
# and 10.x (with cuDNN newer than 9.15, as the cu130 wheels'); GPU allocator histories of H100
# and H200 steps show it (compiler/measure/emulation.py CUDNN_MAX_HEAD_DIM).
CUDNN_ATTENTION_ARCHS = ("sm90", "sm100")


def formula_context(
    setup: Setup, batch: int, seq: int, trainable: bool, grad_in: bool, checkpointing: bool, bias_trains: bool = False, requires_grad: bool | None = None
) -> dict[str, Any]:
    return {
        "batch": batch,
        "seq": seq,
        "tokens": batch * seq,
        "trainable": trainable,
        "requires_grad": trainable if requires_grad is None else requires_grad,
        "bias_trains": bias_trains,
        "grad_in": grad_in,
        "grad_flows": trainable or grad_in or bias_trains,
        "bytes": dict(setup.bytes),
        "attention": setup.attention,
        "cudnn_attention": setup.target.arch in CUDNN_ATTENTION_ARCHS,
        "images": setup.vision_items,
        "videos": setup.videos_per_sample,
        "video_frames": setup.video_frames,
        "micro_batch": setup.micro_batch,
        "target_len": setup.target_len,
        "image_h": setup.image_hw[0],
        "image_w": setup.image_hw[1],
        "grid_rows": setup.grid[0],
        "grid_cols": setup.grid[1],
        "checkpointing": checkpointing,
        "input_grads": setup.input_require_grads,
        "fused_loss": setup.loss == "fused_linear_cross_entropy",
        "offloading": setup.activation_offloading,
        "autocast": setup.mode == "autocast",
        "packed": setup.packing,
        "tp": setup.tp,
        "sp": setup.sp,
        "pp": setup.pp,
        "transformers": setup.transformers,
    }
