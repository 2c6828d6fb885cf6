"""t5 (encoder-decoder: T5 and Flan-T5, T5ForConditionalGeneration) for the measuring harness.

Contract: as in `causal_lm.py`: `load_config(path)` reads config.json into T5Config with the
KV cache off; `module_groups(model)` maps "language" to the whole model (the shared table,
both stacks, the head); `make_batch` returns input_ids [micro_batch, seq_len] (the encoder's
source) and labels [micro_batch, target_len] (the decoder's target, which the model shifts
right into decoder_input_ids) and no attention masks (no padding).
"""

from __future__ import annotations

import torch

from ..experiment import ExperimentError
from .causal_lm import TEXT_TOKEN_ID, load_config, module_groups

__all__ = ["load_config", "make_batch", "model_class", "module_groups"]


def model_class():
    from transformers import T5ForConditionalGeneration

    return T5ForConditionalGeneration


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """input_ids [b, seq_len] and labels [b, target_len] of one token id; no masks."""
    if exp["images_per_sample"]:
        raise ExperimentError(f"experiment {exp['experiment']!r}: T5 takes no images, got images_per_sample {exp['images_per_sample']}")
    if not exp.get("target_len"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: an encoder-decoder model needs target_len (the decoder's positions)")
    if exp.get("packing"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: packing is not measured for an encoder-decoder model")
    b = exp["micro_batch"]
    input_ids = torch.full((b, exp["seq_len"]), TEXT_TOKEN_ID, dtype=torch.long)
    labels = torch.full((b, exp["target_len"]), TEXT_TOKEN_ID, dtype=torch.long)
    return {"input_ids": input_ids, "labels": labels, "attention_mask": None}
