"""Gemma 3 (Gemma3ForConditionalGeneration) for the measuring harness.

Contract: as in `llava.py`. The batch carries token_type_ids as Gemma3Processor makes them:
1 over the image tokens (each image's block attended bidirectionally), 0 over the text, whose
positions alone carry labels. The image tokens come first in every sample, one block of
mm_tokens_per_image per image.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import NormalInit, fixed_size_batch
from .llava import module_groups  # noqa: F401  (model.vision_tower / model.multi_modal_projector / model.language_model, lm_head)


def load_config(config_path: Path):
    """Gemma3Config from a config.json, with the KV cache off (training)."""
    from transformers import Gemma3Config

    config = Gemma3Config(**json.loads(Path(config_path).read_text()))
    config.text_config.use_cache = False
    return config


def model_class():
    return NormalInit("Gemma3ForConditionalGeneration")


def image_tokens_per_image(config) -> int:
    """mm_tokens_per_image: 256 (the 64 x 64 patch grid of an 896-px image pooled to 16 x 16)."""
    return config.mm_tokens_per_image


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (image tokens first), token_type_ids and labels."""
    return fixed_size_batch(config, exp, dtype, image_tokens_per_image(config), token_type_ids=True)
