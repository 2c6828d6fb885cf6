"""gemma2 (text-only causal LM) for the measuring harness: the shared builder in `causal_lm.py`.

NB: Gemma2PreTrainedModel sets `_supports_sdpa = False` (SDPA has no logit softcapping), so
transformers 5.23 refuses `attn_implementation="sdpa"`; eager is the default and the only
implementation measurable here (flash_attention_2 needs the flash-attn package, whose
softcap the SDPA flash kernel lacks).
"""

from __future__ import annotations

from .causal_lm import load_config, make_batch, model_class_for, module_groups

__all__ = ["load_config", "make_batch", "model_class", "module_groups"]


def model_class():
    return model_class_for("gemma2")
