"""Make a traced CPU step allocate what the same step allocates on a CUDA GPU (sm80-sm90).

Contract: `cuda_behaviour(...)` is a context manager that patches, for its duration, the few
places where torch or transformers take a different path on CPU (or on fake tensors) than on
CUDA, and returns the names of the behaviours it applied (recorded in each measurement).
`kernel_scratch` names the bytes CUDA kernels allocate through the caching allocator inside
one op, invisible to the dispatcher; `persistent_scratch` names those that stay allocated
across ops. Every number cites the source it comes from.

Patched (only while the context is active):
- `torch.nn.functional.scaled_dot_product_attention` -> `aten._scaled_dot_product_flash_attention`
  for 16-bit inputs without a mask whose q, k and v share a head dim (what CUDA's dispatcher
  picks on sm80-sm90; its autograd node saves q, k, v, out and an fp32 logsumexp [b, heads, s]),
  or `aten._scaled_dot_product_efficient_attention` otherwise (fp32, a mask, or value heads
  narrower than the query's, DeepSeek-V2's MLA; logsumexp padded to a multiple of 32), or, for
  16-bit calls cuDNN takes, `aten._scaled_dot_product_cudnn_attention`, which sm90 and sm100
  prefer (see CUDNN_MAX_HEAD_DIM). The CPU build would run the math kernel (s^2 scores in fp32). A
  module attribute patch, not a TorchFunctionMode: function modes are not active during
  checkpoint recomputation.
- `torch.nn.functional.dropout` -> `aten.native_dropout` when training with 0 < p < 1 (CUDA's
  fused kernel saves a bool mask; CPU saves a noise tensor in the input dtype).
- `transformers.masking_utils.find_packed_sequence_indices` -> None for fake position ids:
  transformers treats fake tensors as tracing and would then build a packed-sequence mask
  and materialise a [b, 1, s, s] causal mask instead of using SDPA's `is_causal`.
- `TRANSFORMERS_DISABLE_TORCH_CHECK=1`: the image-token count check reads tensor values.
- `torch._subclasses.fake_tensor.CONSTANT_NUMEL_LIMIT` -> `HOST_VALUE_NUMEL_LIMIT` when the
  family reads batch values on the host (Qwen2-VL: token types, image grids): their fake
  tensors carry constants, and what is computed from constants only stays constant, so
  `.tolist()` works; on CUDA these are real tensors read with a host sync.
- `FakeOpsAsCuda`, a dispatch mode under the tracer, for two ops fake tensors run otherwise:
  `native_layer_norm` on 16-bit inputs returns its saved mean and rstd in fp32 on CUDA
  (accumulate type), in the input dtype on CPU (torch/_refs `native_layer_norm`: "if
  input.device.type in ['cpu', 'mtia']"); and a tied embedding's two gradients are summed by
  autograd's input buffer in place where it holds the first alone, which it never does for a
  fake tensor (a tensor subclass: torch/csrc/autograd/input_buffer.cpp
  `can_accumulate_inplace`); on real tensors, CPU or CUDA, it does.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FLASH_ATTENTION = "sdpa-flash-attention"
EFFICIENT_ATTENTION = "sdpa-efficient-attention-for-fp32-or-masked"
# A record traced with it ran a masked 16-bit sdpa call that cuDNN takes as cuDNN attention;
# before it such a call ran the memory-efficient kernel in the trace
CUDNN_ATTENTION = "sdpa-cudnn-attention-for-masked-16-bit"
CUDNN_BACKWARD_SCRATCH = "cudnn-attention-backward-accumulators"
NATIVE_DROPOUT = "dropout-bool-mask"
# A record traced with it made native_dropout's mask before its output (`made_order`); before it
# the output came first
DROPOUT_MASK_FIRST = "dropout-mask-made-first"
NO_PACKED_SEQUENCE_MASK = "no-packed-sequence-mask-on-fake-tensors"
NO_TORCH_CHECK = "transformers-torch-check-disabled"
LAYER_NORM_STATS_FP32 = "layer-norm-mean-rstd-fp32"
# A record traced with it summed a tied embedding's gradients in place where torch does on
# real tensors; before it every such sum on fake tensors was out of place (a third table)
INPUT_BUFFER_IN_PLACE = "input-buffer-adds-in-place"
STEP_ON_HOST = "optimizer-step-counters-on-host"
FLASH_BACKWARD_SCRATCH = "flash-attention-backward-accumulators"
MASKED_SCATTER_SCRATCH = "masked-scatter-prefix-sum"
# A record traced with it made masked_scatter's contiguous copy of its broadcast mask after the
# prefix sum; before it the trace made the prefix sum alone
MASKED_SCATTER_MASK = "masked-scatter-contiguous-mask"
MASKED_SELECT_SCRATCH = "masked-scatter-backward-nonzero-indices"
CUBLAS_WORKSPACE = "cublas-workspace-per-thread"
# The replay's rules from GPU allocator histories (docs/measuring.md): cudaMalloc gives each new
# large segment an address below the others (compiler.memory.allocator), each thread's
# workspaces are made at its first GEMM, and the tied output embedding's own weight is made and
# dropped at the build. A record whose list lacks them predates them: its reserved was replayed
# without them (allocated is the same either way).
# (the first is compiler.memory.allocator.SEGMENTS_DESCENDING, the record reader's check without torch)

WORKSPACE_AT_FIRST_GEMM = "cublas-workspace-at-first-gemm"
TIED_HEAD_AT_BUILD = "tied-output-embedding-made-at-build"
SOFTMAX_BACKWARD_SCRATCH = "softmax-backward-grad-times-output"
HOST_VALUES = "host-read-inputs-keep-values"
# Elements up to which FakeTensorMode keeps a tensor computed from constants as a constant
# (torch/_subclasses/fake_tensor.py CONSTANT_NUMEL_LIMIT is 1: only scalars). Raised while a
# family reads batch values on the host: token ids and types are b * s elements, the image
# grid's derived position ids and window indices a few times the patches.
HOST_VALUE_NUMEL_LIMIT = 1 << 24

# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: flash attention needs fp16/bf16 and a
# head dim <= 256 (sm80-sm90).
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256

# flash_api.cpp `mha_bwd` (PyTorch's vendored FlashAttention-2): `bool loop = true;`
# softmax_d = empty({b, h, seqlen_q_rounded}, fp32); dq_accum = empty({b, seqlen_q_rounded,
# h, head_size_rounded}, fp32) with seqlen_q_rounded = round_multiple(seqlen_q, 128) and
# head_size_rounded = round_multiple(head_size, 32) for head_size <= 192, else 256.
FLASH_BWD_SEQ_ROUND = 128
FLASH_BWD_HEAD_ROUND = 32
FLASH_BWD_MAX_ROUNDED_HEAD = 192
FLASH_BWD_WIDE_HEAD = 256
FP32_BYTES = 4
INT64_BYTES = 8

# sdp_utils.cpp (torch 2.11, cu130 wheels with cuDNN 9.19): on sm90 and sm100
# `check_prefer_cudnn_attention` puts cuDNN attention first (cuDNN newer than 9.15);
# `can_use_cudnn_attention` takes 16-bit q, k and v with head dims up to 256 (cuDNN >= 9.10 on
# sm90), each a multiple of 8 (v's may differ from q's), more than one key position, and a
# 2-D or 4-D mask that does not require grad. GPU allocator histories (H100 and H200, torch
# 2.11.0+cu130, tests/fixtures/gpu-history) show it in every sdpa call but a mask requiring
# grad (T5's trained relative bias: the memory-efficient kernel). Forward: an 8 B philox seed
# and offset on the device, the output laid out like q (`alloc_with_matching_layout`), fp32
# softmax stats [b, h, s, 1] (none without grad); backward: dQ, dK, dV and a workspace of
# 4 b h s d_qk + 4 b h s + 256 B (the fp32 dQ accumulator, the row sums), + 2 b h s_k
# (d_qk + d_v) B with fewer key heads than query heads. The trace runs the calls that the
# flash kernel cannot (a mask, or narrower value heads) as cuDNN; an unmasked call keeps the
# flash kernel, whose memory is the same but for that workspace (not emulated).
CUDNN_MAX_HEAD_DIM = 256
CUDNN_HEAD_DIM_MULTIPLE = 8
CUDNN_WORKSPACE_EXTRA = 256


def cudnn_takes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """Whether cuDNN attention runs this sdpa call (see CUDNN_MAX_HEAD_DIM)."""
    dims = (query.shape[-1], value.shape[-1])
    return (
        query.dtype in FLASH_DTYPES
        and key.dtype == value.dtype == query.dtype
        and key.shape[-1] == query.shape[-1]
        and all(d <= CUDNN_MAX_HEAD_DIM and d % CUDNN_HEAD_DIM_MULTIPLE == 0 for d in dims)
        and key.shape[-2] > 1
        and (attn_mask is None or (not attn_mask.requires_grad and attn_mask.dim() in (2, 4)))
    )


def _cudnn_backward_scratch(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> int:
    """Bytes of one cuDNN attention backward's workspace (query [b, h, s, d])."""
    b, h, s, d = query.shape
    grouped = 2 * b * h * key.shape[-2] * (d + value.shape[-1]) if key.shape[-3] < h else 0
    return FP32_BYTES * b * h * s * d + FP32_BYTES * b * h * s + CUDNN_WORKSPACE_EXTRA + grouped


# aten/src/ATen/cuda/CublasHandlePool.cpp (parseChosenWorkspaceSize): default
# CUBLAS_WORKSPACE_CONFIG is 32 MiB on Hopper (sm90), ":4096:2:16:8" (8 MiB + 128 KiB)
# before it; allocated through the caching allocator and cached per (handle, stream); handles
# are per thread. CUBLASLT_WORKSPACE_SIZE defaults to 1024 KiB, cached the same way.
CUBLAS_WORKSPACE_BYTES_SM90 = 4096 * 8 * 1024
CUBLAS_WORKSPACE_BYTES_SM80 = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024


def _round_multiple(x: int, m: int) -> int:
    return -(-x // m) * m


def _flash_backward_scratch(query: torch.Tensor) -> int:
    """Bytes of softmax_d + dq_accum for one flash-attention backward (query [b, h, s, d])."""
    b, h, s, d = query.shape
    s_r = _round_multiple(s, FLASH_BWD_SEQ_ROUND)
    d_r = _round_multiple(d, FLASH_BWD_HEAD_ROUND) if d <= FLASH_BWD_MAX_ROUNDED_HEAD else FLASH_BWD_WIDE_HEAD
    return FP32_BYTES * b * h * s_r + FP32_BYTES * b * s_r * h * d_r


def kernel_scratch(func, args, kwargs, out):
    """Named bytes a CUDA kernel allocates inside `func` and frees before returning."""
    if func is torch.ops.aten._scaled_dot_product_flash_attention_backward.default:
        # args: grad_out, query, key, value, out, logsumexp, ...
        return ((FLASH_BACKWARD_SCRATCH, _flash_backward_scratch(args[1])),)
    if func is torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default:
        # args: grad_out, query, ... (see CUDNN_MAX_HEAD_DIM)
        return ((CUDNN_BACKWARD_SCRATCH, _cudnn_backward_scratch(args[1], args[2], args[3])),)
    if func is torch.ops.aten._softmax_backward_data.default:
        # ATen/native/cuda/SoftMax.cu `softmax_backward_cuda_out`: `Tensor tmp = grad * output;`
        # before the kernel, after grad_input (the structured op's output) exists; the CPU
        # kernel computes the same sum without it. Eager attention's fp32 probabilities make it
        # a [b, heads, s, s] fp32 tensor: the 8 GiB by which an H100 step of LLaVA-1.5-7B at
        # batch 16, seq 2048 exceeded the trace (tests/measured/gpu).
        grad, output = args[0], args[1]
        return ((SOFTMAX_BACKWARD_SCRATCH, grad.numel() * torch.promote_types(grad.dtype, output.dtype).itemsize),)
    if func in (torch.ops.aten.masked_scatter.default, torch.ops.aten.masked_scatter_.default):
        # ATen/native/cuda/IndexKernel.cpp `masked_scatter__cuda`:
        # maskPrefixSum = at::empty(self.sizes(), kLong). The out-of-place op (what LLaVA
        # calls) is CompositeExplicitAutograd clone + masked_scatter_, one op to the tracer.
        # Then launch_masked_scatter_kernel makes the mask contiguous (mask.contiguous()): the
        # image-token mask LLaVA expands over the hidden size becomes one bool per element, as
        # an H200 allocated it (LLaVA-1.5-7B, b 56, s 2048: the 3,584 MiB prefix sum, then
        # 448 MiB). NB, not traced: cub's scan scratch after it (8 MiB there).
        mask = args[1]
        whole = mask.is_contiguous() and mask.numel() == out.numel()
        return ((MASKED_SCATTER_SCRATCH, INT64_BYTES * out.numel()), (MASKED_SCATTER_MASK, 0 if whole else out.numel() * mask.element_size()))
    if func is torch.ops.aten.masked_scatter_backward.default:
        # FunctionsManual.cpp masked_scatter_backward -> grad.masked_select(mask); CUDA
        # masked_select indexes with the broadcast bool mask, whose nonzero() is an int64
        # [n_selected, ndim] index tensor (n_selected = numel of the source = `sizes`).
        grad, _, sizes = args
        return ((MASKED_SELECT_SCRATCH, INT64_BYTES * grad.dim() * math.prod(sizes)),)
    return ()


def made_order(func, outputs: list) -> list:
    """An op's outputs in the order its CUDA kernel allocates them, where that is not the order
    it returns them: Dropout.cu's `dropout_cuda` makes the bool mask, then the output
    (`empty_like(self, bool)`, then `empty_like(self)`), and native_dropout returns (output,
    mask); an H200 allocated the mask first (LLaVA-1.5-7B's LoRA dropout at b 56, s 2048)."""
    if func is torch.ops.aten.native_dropout.default and len(outputs) == 2:
        return outputs[::-1]
    return outputs


def _cublas_workspace(sm90: bool) -> int:
    return CUBLAS_WORKSPACE_BYTES_SM90 if sm90 else CUBLAS_WORKSPACE_BYTES_SM80


def persistent_scratch(threads_with_gemms: int, sm90: bool = True) -> dict[str, int]:
    """cuBLAS + cuBLASLt workspaces once `threads_with_gemms` threads have run a GEMM.

    NB: the forward runs on the Python thread, CUDA backward on the autograd engine's device
    thread; each has its own cuBLAS handle, hence its own cached workspaces.
    """
    per_thread = _cublas_workspace(sm90) + CUBLASLT_WORKSPACE_BYTES
    return {CUBLAS_WORKSPACE: threads_with_gemms * per_thread} if threads_with_gemms else {}


def allocate_workspaces(allocator, threads_with_gemms: int, sm90: bool = True) -> None:
    """Hand `allocator` the workspaces of `persistent_scratch` as the blocks they are: per
    thread one cuBLAS workspace and one cuBLASLt workspace, each cached for good."""
    if allocator is None:
        return
    for thread in range(threads_with_gemms):
        allocate_workspace(allocator, thread, True, sm90)


def allocate_workspace(allocator, thread: int, cublaslt: bool, sm90: bool = True) -> None:
    """One thread's workspaces as a GPU makes them, each cached for good: the cuBLAS one at
    its first GEMM (`getCurrentCUDABlasHandle` sets it), the cuBLASLt one beside it at its
    first GEMM on the Lt path (in six allocator histories of an H200: the forward's first
    `addmm` with a bias made both, one after the other; a model whose first GEMM was an `mm`
    made the Lt one only at its first biased linear; autograd's thread made the Lt one only
    where checkpointing recomputed a biased linear in backward)."""
    if ("cublas", thread) not in allocator:
        allocator.malloc(("cublas", thread), _cublas_workspace(sm90))
    if cublaslt and ("cublaslt", thread) not in allocator:
        allocator.malloc(("cublaslt", thread), CUBLASLT_WORKSPACE_BYTES)


class FakeOpsAsCuda(TorchDispatchMode):
    """Run two ops on fake tensors as CUDA runs them (LAYER_NORM_STATS_FP32 and
    INPUT_BUFFER_IN_PLACE): one mode, so that each op of a trace passes one more Python frame,
    not two.

    `native_layer_norm` on 16-bit inputs: its mean and rstd in fp32.

    A tied embedding's two gradients summed as autograd's input buffer sums real tensors.
    `InputBuffer::accumulate` (torch/csrc/autograd/input_buffer.cpp, grad mode off) adds the
    arriving gradient into the one it holds in place (`old_var.add_(var)`) where
    `can_accumulate_inplace(old_var)`: a plain dense tensor whose storage it holds alone; else
    `old_var + var`, a new tensor. A fake tensor is a tensor subclass, so on fake tensors the sum
    is always a new one. Narrowed to where the add is known to be the buffer's: an `add.Tensor`
    while `EmbeddingBackward0` runs (the embedding's own backward adds nothing; the engine sums
    the node's output into the weight's buffer before the node is left). The held gradient is
    the lm_head's: the fused loss's saved `grad_weight`, a tensor of its own, is summed into in
    place (GPU allocator history, Qwen2.5-0.5B fused loss: embedding_dense_backward's table made
    and freed, no third); nn.Linear's is a view (`.t()` of mm's result, twice) whose base holds
    the storage too, and the sum is a new tensor (GPU history, Gemma-3-1B: the third table made),
    into which a third lookup of the table adds in place (GPU history, Flan-T5-base: the
    decoder's lookup makes the sum, the encoder's frees its dense table with no sum of its own).
    NB: a view stands for a storage held twice; tests/test_measure_tricks.py pins torch's rule on
    real tensors and the emulation's on fake ones."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.add.Tensor and not kwargs and _buffer_sum_in_place(*args):
            return args[0].add_(args[1])
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.native_layer_norm.default and out[1].dtype != torch.float32:
            out = (out[0], out[1].float(), out[2].float())
        return out


def _buffer_sum_in_place(held: torch.Tensor, arriving: torch.Tensor) -> bool:
    """add.Tensor(held, arriving) (both tensors by its schema, alpha keyword-only) is the input
    buffer's sum into a gradient of its own."""
    return (
        type(torch._C._current_autograd_node()).__name__ == "EmbeddingBackward0"
        and held.shape == arriving.shape
        and held.dtype == arriving.dtype
        and not held._is_view()
        and held.is_contiguous()
    )


def _sdpa_as_cuda(original):
    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):
            # NB: under autocast, CUDA's policy for scaled_dot_product_attention
            # (lower_precision_fp) casts q, k, v and a floating mask before the kernel is picked
            low = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(low) if t.dtype == torch.float32 else t for t in (query, key, value))
            if attn_mask is not None and attn_mask.dtype == torch.float32:
                attn_mask = attn_mask.to(low)
        # NB: CUDA's flash kernel takes fewer KV heads natively (enable_gqa), and so do the
        # meta kernels: k and v pass as they are. No LLaVA-1.5 model uses GQA.
        # NB: the flash kernel takes one head dim for q, k and v (sdp_utils.cpp
        # check_head_dim_size_flash); DeepSeek-V2's MLA has narrower value heads (128 of 192)
        head_dim = query.shape[-1]
        same_dims = key.shape[-1] == head_dim and value.shape[-1] == head_dim
        if attn_mask is None and query.dtype in FLASH_DTYPES and head_dim <= FLASH_MAX_HEAD_DIM and same_dims:
            return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if cudnn_takes(query, key, value, attn_mask):
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                # NB: attention.cpp's convert_boolean_attn_mask_cudnn: where(mask, 0, -inf) with
                # two 0-dim device tensors (the GPU history's two 2-byte allocations)
                zero, inf = (torch.full((), v, dtype=query.dtype, device=query.device) for v in (0.0, float("-inf")))
                attn_mask = torch.where(attn_mask, zero, inf)
            # NB: the stats only where a gradient will need them (attention.cpp should_compute_logsumexp)
            stats = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            return torch.ops.aten._scaled_dot_product_cudnn_attention(query, key, value, attn_mask, stats, dropout_p, is_causal, False, scale=scale)[0]
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(attn_mask.logical_not(), float("-inf"))
        return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale)[0]

    scaled_dot_product_attention.__wrapped__ = original
    return scaled_dot_product_attention


def _dropout_as_cuda(original):
    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0 and not inplace:
            return torch.ops.aten.native_dropout(input, p, training)[0]
        return original(input, p, training, inplace)

    dropout.__wrapped__ = original
    return dropout


def _packed_sequences_as_cuda(original):
    from torch._subclasses.fake_tensor import FakeTensor

    def find_packed_sequence_indices(position_ids):
        # NB: an unpacked batch's position ids are one arange per row, for which the real
        # function returns None; a packed experiment (packing: true) skips this patch.
        if isinstance(position_ids, FakeTensor):
            return None
        return original(position_ids)

    return find_packed_sequence_indices


@contextlib.contextmanager
def cuda_behaviour(*, fake: bool, skip: frozenset = frozenset(), host_values: bool = False) -> Iterator[list[str]]:
    """Apply the CUDA emulation, less the behaviours named in `skip`; yields the names applied.

    `host_values`: the batch has fake tensors with constants (see `HOST_VALUES`)."""
    import torch.nn.functional as F
    from torch._subclasses import fake_tensor

    try:
        from transformers import masking_utils
    except ImportError:  # NB: transformers 4.x builds its masks in each model, packed sequences unseen
        masking_utils = None

    saved_sdpa, saved_dropout = F.scaled_dot_product_attention, F.dropout
    saved_packed = masking_utils.find_packed_sequence_indices if masking_utils else None
    saved_env = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    saved_limit = fake_tensor.CONSTANT_NUMEL_LIMIT
    applied = []
    if fake and host_values:
        fake_tensor.CONSTANT_NUMEL_LIMIT = HOST_VALUE_NUMEL_LIMIT
        applied.append(HOST_VALUES)
    if FLASH_ATTENTION not in skip:
        F.scaled_dot_product_attention = _sdpa_as_cuda(saved_sdpa)
        applied += [FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION]
    if NATIVE_DROPOUT not in skip:
        F.dropout = _dropout_as_cuda(saved_dropout)
        applied.append(NATIVE_DROPOUT)
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    applied.append(NO_TORCH_CHECK)
    if fake and NO_PACKED_SEQUENCE_MASK not in skip and masking_utils is not None:
        masking_utils.find_packed_sequence_indices = _packed_sequences_as_cuda(saved_packed)
        applied.append(NO_PACKED_SEQUENCE_MASK)
    try:
        yield applied
    finally:
        F.scaled_dot_product_attention, F.dropout = saved_sdpa, saved_dropout
        if masking_utils is not None:
            masking_utils.find_packed_sequence_indices = saved_packed
        fake_tensor.CONSTANT_NUMEL_LIMIT = saved_limit
        if saved_env is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK", None)
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = saved_env


# --- autocast: CUDA's op policy on the CPU's autocast key -------------------------------------
#
# torch.autocast("cuda") dispatches through AutocastCUDA, which a CPU tensor (fake or real)
# never reaches; torch.autocast("cpu") runs AutocastCPU, whose op lists differ
# (aten/src/ATen/autocast_mode.cpp: the CPU list has no fp32 policy for softmax, log_softmax,
# layer_norm, rms_norm, pow, rsqrt, exp, sum, ..., and lists ops CUDA does not, e.g. cat, stack,
# cross_entropy_loss). `CudaAutocastPolicy` re-registers, while it is active, every AutocastCPU
# kernel whose policy differs from CUDA's: each op of CUDA's lists gets CUDA's policy, each op
# only CPU lists passes through uncast. The ops both list as lower_precision_fp (linear, mm,
# matmul, addmm, bmm, baddbmm, addbmm, the convolutions, scaled_dot_product_attention, ...)
# keep torch's own kernel, and with it the real cast cache (`cached_cast`: the 16-bit copy of
# an fp32 leaf that requires grad, kept until the outermost autocast context exits).
AUTOCAST_CUDA_POLICY = "autocast-cuda-op-policy"

# torch 2.13 aten/src/ATen/autocast_mode.h (installed under torch/include/ATen): CUDA's lists.
CUDA_LOWER_PRECISION_FP = (
    "_convolution.deprecated",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
    # autocast_mode.cpp registers these two for CUDA besides the list
    "cudnn_convolution",
    "cudnn_convolution_transpose",
)
CUDA_FP32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
CUDA_FP32_SET_OPT_DTYPE = (
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
)
# fp32_append_dtype: norm without a dtype redispatched to its overload with one
CUDA_FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
CUDA_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put", "tensordot", "scatter_add")
# autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCPU, m): its lower_precision_fp list
CPU_LOWER_PRECISION_FP = (
    "conv1d",
    "conv1d.padding",
    "conv2d",
    "conv2d.padding",
    "conv3d",
    "conv3d.padding",
    "bmm",
    "mm",
    "linalg_vecdot",
    "baddbmm",
    "addmm",
    "_addmm_activation",
    "addbmm",
    "linear",
    "_convolution.deprecated",
    "matmul",
    "conv_tbc",
    "mkldnn_rnn_layer",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "prelu",
    "scaled_dot_product_attention",
    "_native_multi_head_attention",
)
# The AutocastCPU kernels left in place: the same policy (lower_precision_fp) on both devices.
KEEP_CPU_KERNEL = frozenset(CUDA_LOWER_PRECISION_FP) & frozenset(CPU_LOWER_PRECISION_FP)


def _overload(name: str):
    op, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, op), overload or "default")


def _floating(x) -> bool:
    # autocast_mode.h is_autocast_eligible / is_eligible: a defined floating tensor on the
    # device, not double
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


class CudaAutocastPolicy:
    """While active, AutocastCPU applies CUDA's policy to every op whose CPU policy differs.

    NB: the lower_precision_fp ops this re-registers (einsum, mv, addmv, ...) cast through a
    cache of their own with `cached_cast`'s rule (an fp32 leaf that requires grad, not a view),
    cleared where torch clears its own (`torch.clear_autocast_cache`, at the outermost
    autocast exit)."""

    def __init__(self) -> None:
        self.lib = None
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.saved_clear = None

    def _cast(self, dtype, x, cache: bool):
        if not _floating(x) or x.dtype == dtype:
            return x
        if cache and dtype != torch.float32 and x.dtype == torch.float32 and x.requires_grad and x.is_leaf and not x._is_view():
            hit = self.cache.get(id(x))
            if hit is None or hit[0] is not x:
                hit = self.cache[id(x)] = (x, x.to(dtype))
            return hit[1]
        return x.to(dtype)

    def _kernel(self, name: str):
        op = _overload(name)
        key = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
        args_schema = op._schema.arguments
        dtype_index = next((i for i, a in enumerate(args_schema) if a.name == "dtype"), None)

        def cast_all(args, kwargs, dtype, cache):
            return ([self._cast(dtype, a, cache) for a in args], {k: self._cast(dtype, v, cache) for k, v in kwargs.items()})

        def kernel(*args, **kwargs):
            lower = torch.get_autocast_dtype("cpu")
            with torch._C._ExcludeDispatchKeyGuard(key):
                if name in CUDA_LOWER_PRECISION_FP:
                    args, kwargs = cast_all(args, kwargs, lower, True)
                elif name in CUDA_FP32:
                    args, kwargs = cast_all(args, kwargs, torch.float32, False)
                elif name in CUDA_FP32_SET_OPT_DTYPE:
                    given = kwargs.get("dtype", args[dtype_index] if dtype_index is not None and dtype_index < len(args) else None)
                    if given is None and args and _floating(args[0]):
                        if dtype_index is not None and dtype_index < len(args):
                            args = list(args)
                            args[dtype_index] = torch.float32
                        else:
                            kwargs = {**kwargs, "dtype": torch.float32}
                elif name in CUDA_FP32_APPEND_DTYPE:
                    if args and _floating(args[0]):
                        return _overload(CUDA_FP32_APPEND_DTYPE[name])(*args, **kwargs, dtype=torch.float32)
                elif name in CUDA_PROMOTE:
                    tensors = [a for a in (*args, *kwargs.values()) if _floating(a)]
                    widest = torch.float32 if any(t.dtype == torch.float32 for t in tensors) else lower
                    args, kwargs = cast_all(args, kwargs, widest, False)
                # else: an op only CPU's lists name: CUDA runs it uncast
                return op(*args, **kwargs)

        return kernel

    def __enter__(self):
        import warnings

        cuda = {*CUDA_LOWER_PRECISION_FP, *CUDA_FP32, *CUDA_FP32_SET_OPT_DTYPE, *CUDA_FP32_APPEND_DTYPE, *CUDA_PROMOTE}
        cpu = {r.removeprefix("aten::") for r in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU")}
        self.lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            for name in sorted((cuda | cpu) - KEEP_CPU_KERNEL):
                self.lib.impl(name, self._kernel(name), "AutocastCPU")
        self.saved_clear = torch.clear_autocast_cache

        def clear_autocast_cache():
            self.cache.clear()
            self.saved_clear()

        torch.clear_autocast_cache = clear_autocast_cache
        return self

    def __exit__(self, *exc) -> None:
        torch.clear_autocast_cache = self.saved_clear
        self.cache.clear()
        self.lib._destroy()
        self.lib = None
