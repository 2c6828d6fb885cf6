"""LLaVA-OneVision (LlavaOnevisionForConditionalGeneration: SigLIP, anyres_max_9 tiling, Qwen2)
for the measuring harness.

Contract: as `llava_next.py`. The batch is what LlavaOnevisionProcessor produces for one image
per sample of the experiment's `image_size` [h, w]: `pixel_values` [b, 1 + tiles, C, 384, 384]
(the base image and the tiles of the best grid pinpoint), `image_sizes` [b, 2] = (h, w),
`input_ids` of exactly seq_len positions whose first positions per sample are the image
tokens, as many as the processor counts (`_get_number_of_features`, the count the model's
`pack_image_features` must match), and labels with those at -100.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

from . import NormalInit, llava_next
from .llava_next import checkpoint_module, module_groups  # noqa: F401  (LLaVA-NeXT's layout: vision_tower, multi_modal_projector and image_newline, language_model)

HOST_VALUES = ("image_sizes",)


def load_config(config_path: Path):
    """LlavaOnevisionConfig from a config.json, with the KV cache off (training)."""
    from transformers import LlavaOnevisionConfig

    config = LlavaOnevisionConfig(**json.loads(Path(config_path).read_text()))
    config.text_config.use_cache = False
    return config


def model_class():
    return NormalInit("LlavaOnevisionForConditionalGeneration")


def anyres(config, image_size: list[int]) -> tuple[int, int]:
    """(crops, image tokens) of one image of `image_size` [h, w]: the crops by the model's
    `image_size_to_num_patches`, the tokens by LlavaOnevisionProcessor's own count (the base
    image's features, the tiles' unpadded and anyres_max-scaled features, a newline per row)."""
    from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    v = config.vision_config
    side = v.image_size // v.patch_size
    crops = image_size_to_num_patches(list(image_size), config.image_grid_pinpoints, v.image_size)
    counter = SimpleNamespace(
        num_image_tokens=side * side,
        vision_aspect_ratio=config.vision_aspect_ratio,
        image_processor=SimpleNamespace(image_grid_pinpoints=config.image_grid_pinpoints),
        _get_unpadded_features=lambda *a: LlavaOnevisionProcessor._get_unpadded_features(counter, *a),
    )
    tokens = LlavaOnevisionProcessor._get_number_of_features(counter, image_size[0], image_size[1], v.image_size, v.image_size)
    return crops, tokens


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return llava_next.anyres_batch(config, exp, dtype, anyres, "LLaVA-OneVision")
