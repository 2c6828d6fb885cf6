"""bloom (text-only causal LM: BLOOM, BLOOMZ) for the measuring harness: the shared builder in `causal_lm.py`."""

from __future__ import annotations

from .causal_lm import load_config, make_batch, model_class_for, module_groups

__all__ = ["load_config", "make_batch", "model_class", "module_groups"]


def model_class():
    return model_class_for("bloom")
