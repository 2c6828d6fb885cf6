"""GLM-4.1V (Glm4vForConditionalGeneration) for the measuring harness.

The batch, host values and checkpointing are Qwen2-VL's (`qwen2_vl.py`): pixel_values
[patches, C * 2 * 14 * 14], image_grid_thw (1, h / 14, w / 14) after the processor's
smart_resize with factor 28, the image tokens first in every sample, mm_token_type_ids 1 at
them. Glm4vImageProcessor bounds t x h x w with t = temporal_patch_size for an image (its two
temporal copies), so its size.shortest_edge / longest_edge are halved into Qwen2-VL's
min_pixels / max_pixels over h x w. The vision tower's groups are everything of
Glm4vVisionModel but the merger (patch embedding, post_conv_layernorm, the position table,
blocks, post_layernorm, downsample); the projector is the merger.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import torch

from . import qwen2_vl, without_cache
from .qwen2_vl import HOST_VALUES, ROPE_INDEX_SHAPES_ONLY, checkpoint_module  # noqa: F401  (the family contract)


def load_config(config_path: Path):
    """Glm4vConfig from a config.json, with the KV cache off (training); the processor's bounds
    (size.shortest_edge / longest_edge over t x h x w) as min_pixels / max_pixels over h x w."""
    from transformers import Glm4vConfig

    config = without_cache(Glm4vConfig(**json.loads(Path(config_path).read_text())), config_path)
    size = config.preprocessor.get("size") or {}
    t = config.vision_config.temporal_patch_size
    for key, name in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if key not in config.preprocessor and name in size:
            config.preprocessor[key] = size[name] // t
    return config


def model_class():
    from transformers import Glm4vForConditionalGeneration

    return Glm4vForConditionalGeneration


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean."""
    visual = model.model.visual
    return {
        "vision": [visual.patch_embed, visual.post_conv_layernorm, visual.embeddings, visual.blocks, visual.post_layernorm, visual.downsample],
        "projector": [visual.merger],
        "language": [model.model.language_model, model.lm_head],
    }


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """`Glm4vModel.get_rope_index` returns position_ids [3, b, s] and rope_deltas [b, 1] of the
    real shapes and dtypes without reading values (as Qwen2-VL's, `qwen2_vl.host_patches`)."""
    from transformers.models.glm4v import modeling_glm4v

    with qwen2_vl.rope_index_by_shape(modeling_glm4v.Glm4vModel):
        yield [ROPE_INDEX_SHAPES_ONLY]


image_grid = qwen2_vl.image_grid
make_batch = qwen2_vl.make_batch
