"""deepseek_v2 (text-only causal LM: DeepSeek-V2, DeepSeek-V2-Lite) for the measuring harness:
the shared builder in `causal_lm.py`.

NB: the attention's value heads are narrower than its query and key heads (v_head_dim 128,
qk_nope_head_dim + qk_rope_head_dim 192), which CUDA's flash kernel does not take: sdpa runs
the memory-efficient kernel (`emulation`, scaled_dot_product_attention)."""

from __future__ import annotations

from .causal_lm import load_config, make_batch, model_class_for, module_groups

__all__ = ["load_config", "make_batch", "model_class", "module_groups"]


def model_class():
    return model_class_for("deepseek_v2")
