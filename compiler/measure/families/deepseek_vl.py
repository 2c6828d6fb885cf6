"""DeepSeek-VL (DeepseekVLForConditionalGeneration) for the measuring harness.

Contract: as in `llava.py`. The batch is what DeepseekVLProcessor makes for training:
`images_per_sample` images per sample, each padded and resized to the tower's image_size
(384 px), `pixel_values` [b x images, 3, size, size] in the compute dtype, `input_ids` of
exactly seq_len positions whose first images x (size / patch)^2 are the image token (576 per
image), labels with those at -100.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import NormalInit, fixed_size_batch, without_cache


def load_config(config_path: Path):
    """DeepseekVLConfig from a config.json, with the KV cache off (training)."""
    from transformers import DeepseekVLConfig

    return without_cache(DeepseekVLConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    return NormalInit("DeepseekVLForConditionalGeneration")


def image_tokens_per_image(config) -> int:
    """(image_size / patch)^2: 576 for SigLIP-L/16 at 384 px."""
    return (config.vision_config.image_size // config.vision_config.patch_size) ** 2


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean."""
    return {
        "vision": [model.model.vision_model],
        "projector": [model.model.aligner],
        "language": [model.model.language_model, model.lm_head],
    }


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (image tokens first in every sample) and labels."""
    return fixed_size_batch(config, exp, dtype, image_tokens_per_image(config))
