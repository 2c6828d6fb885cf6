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

from . import image_first_tokens
from .llava import module_groups  # noqa: F401  (model.vision_tower / model.multi_modal_projector / model.language_model, lm_head)


def load_config(config_path: Path):
    """Gemma3Config from a config.json, with the KV cache off (training)."""
    from transformers import Gemma3Config

    config = Gemma3Config(**json.loads(Path(config_path).read_text()))
    config.text_config.use_cache = False
    return config


class _Gemma3Builder:
    """Gemma3ForConditionalGeneration built as `paligemma._Builder` builds PaliGemma."""

    @staticmethod
    def _from_config(config, **kwargs):
        from transformers import Gemma3ForConditionalGeneration
        from transformers import initialization

        table = initialization.TORCH_INIT_FUNCTIONS
        original = table["trunc_normal_"]
        table["trunc_normal_"] = lambda tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None: tensor.normal_(mean, std, generator=generator)
        try:
            return Gemma3ForConditionalGeneration._from_config(config, **kwargs)
        finally:
            table["trunc_normal_"] = original


def model_class():
    return _Gemma3Builder


def image_tokens_per_image(config) -> int:
    """mm_tokens_per_image: 256 (the 64 x 64 patch grid of an 896-px image pooled to 16 x 16)."""
    return config.mm_tokens_per_image


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (image tokens first), token_type_ids and labels."""
    b, s, images = exp["micro_batch"], exp["seq_len"], exp["images_per_sample"]
    n_image = images * image_tokens_per_image(config)
    input_ids, labels = image_first_tokens(exp, n_image, config.image_token_id)
    size = config.vision_config.image_size
    token_type_ids = torch.zeros((b, s), dtype=torch.long)
    token_type_ids[:, :n_image] = 1
    batch = {"input_ids": input_ids, "labels": labels, "token_type_ids": token_type_ids, "attention_mask": None}
    if images:
        batch["pixel_values"] = torch.zeros(b * images, config.vision_config.num_channels, size, size, dtype=dtype)
    return batch
