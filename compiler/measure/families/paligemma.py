"""PaliGemma and PaliGemma 2 (PaliGemmaForConditionalGeneration) for the measuring harness.

Contract: as in `llava.py`. The batch carries token_type_ids, as PaliGemma's processor makes
them for training: 0 over the image tokens (the prefix, attended bidirectionally), 1 over the
text that follows (the suffix, causal), whose positions alone carry labels.
NB: transformers 5.23 loads PaliGemma 2 (a Gemma 2 language model) with eager or
flash_attention_2 only; asking for sdpa raises in Gemma2Model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import NormalInit, fixed_size_batch
from .llava import module_groups  # noqa: F401  (the same vision_tower / multi_modal_projector / language_model layout)


def load_config(config_path: Path):
    """PaliGemmaConfig from a config.json, with the KV cache off (training)."""
    from transformers import PaliGemmaConfig

    config = PaliGemmaConfig(**json.loads(Path(config_path).read_text()))
    config.text_config.use_cache = False
    return config


def model_class():
    return NormalInit("PaliGemmaForConditionalGeneration")


def image_tokens_per_image(config) -> int:
    """(image_size / patch)^2: 256 at 224 px, 1024 at 448, 4096 at 896 (so400m/14)."""
    return (config.vision_config.image_size // config.vision_config.patch_size) ** 2


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (image tokens first), token_type_ids and labels."""
    return fixed_size_batch(config, exp, dtype, image_tokens_per_image(config), token_type_ids=True)
