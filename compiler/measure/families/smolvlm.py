"""SmolVLM 2 (SmolVLMForConditionalGeneration) for the measuring harness: the Idefics3
builder (`idefics3.py`) with SmolVLM's config and model classes, which allocate alike."""

from __future__ import annotations

import json
from pathlib import Path

from . import without_cache
from .idefics3 import HOST_VALUES, checkpoint_module, host_patches, image_seq_len, make_batch, module_groups, tiles_per_image  # noqa: F401


def load_config(config_path: Path):
    """SmolVLMConfig from a config.json, with the KV cache off (training)."""
    from transformers import SmolVLMConfig

    return without_cache(SmolVLMConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    from transformers import SmolVLMForConditionalGeneration

    return SmolVLMForConditionalGeneration
