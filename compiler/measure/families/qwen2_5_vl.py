"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration) for the measuring harness: the batch,
module groups and host values are Qwen2-VL's (`qwen2_vl.py`); only the classes differ."""

from __future__ import annotations

import json
from pathlib import Path

from .qwen2_vl import (  # noqa: F401  (the family contract, re-exported)
    HOST_VALUES, _without_cache, checkpoint_module, host_patches, image_grid, make_batch, module_groups,
)


def load_config(config_path: Path):
    """Qwen2_5_VLConfig from a config.json, with the KV cache off (training)."""
    from transformers import Qwen2_5_VLConfig

    return _without_cache(Qwen2_5_VLConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration
