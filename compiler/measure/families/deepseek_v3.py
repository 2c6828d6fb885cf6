"""deepseek_v3 (text-only causal LM: DeepSeek-V3-architecture models, Moonlight-16B-A3B) for the
measuring harness: the shared builder in `causal_lm.py`. As deepseek_v2's, the attention's value
heads are narrower than its query and key heads: sdpa runs the memory-efficient kernel."""

from __future__ import annotations

from .causal_lm import load_config, make_batch, model_class_for, module_groups

__all__ = ["load_config", "make_batch", "model_class", "module_groups"]


def model_class():
    return model_class_for("deepseek_v3")
