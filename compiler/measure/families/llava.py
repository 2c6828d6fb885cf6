"""LLaVA (LlavaForConditionalGeneration) for the measuring harness.

Contract (every module in this package): `load_config(path)` returns the transformers config
with the KV cache off; `model_class()` the model class; `module_groups(model)` maps the
experiment's module names to submodules; `make_batch(config, exp, dtype)` returns a real
batch for the experiment (input_ids of exactly seq_len positions with the image tokens
inside, labels, pixel values at the processor's resolution).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import fixed_size_batch


def load_config(config_path: Path):
    """LlavaConfig from a config.json, with the KV cache off (training)."""
    from transformers import LlavaConfig

    config = LlavaConfig(**json.loads(Path(config_path).read_text()))
    # LLaVA's train.py sets `model.config.use_cache = False`; a cache only adds references.
    config.text_config.use_cache = False
    return config


def model_class():
    from transformers import LlavaForConditionalGeneration

    return LlavaForConditionalGeneration


def image_tokens_per_image(config) -> int:
    """576 for CLIP ViT-L/14 at 336 px: one token per patch, CLS dropped ("default")."""
    patches = (config.vision_config.image_size // config.vision_config.patch_size) ** 2
    return patches + (1 if config.vision_feature_select_strategy == "full" else 0)


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean."""
    return {
        "vision": [model.model.vision_tower],
        "projector": [model.model.multi_modal_projector],
        "language": [model.model.language_model, model.lm_head],
    }


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (image tokens first in every sample) and labels."""
    return fixed_size_batch(config, exp, dtype, image_tokens_per_image(config))
