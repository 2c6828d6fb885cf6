"""Qwen3-VL (Qwen3VLForConditionalGeneration) for the measuring harness.

The batch, host values and checkpointing are Qwen2-VL's (`qwen2_vl.py`): pixel_values
[patches, C * 2 * 16 * 16], image_grid_thw (1, h / 16, w / 16) after the processor's
smart_resize with factor 32 (its bounds from preprocessor_config.json's size.shortest_edge and
size.longest_edge), the image tokens first in every sample. The vision tower's groups add the
learned position table (`pos_embed`) and the DeepStack mergers (`deepstack_merger_list`, part
of the projector with the final merger).
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
    """Qwen3VLConfig from a config.json, with the KV cache off (training); the processor's
    resize bounds (size.shortest_edge / longest_edge) as min_pixels / max_pixels."""
    from transformers import Qwen3VLConfig

    config = without_cache(Qwen3VLConfig(**json.loads(Path(config_path).read_text())), config_path)
    size = config.preprocessor.get("size") or {}
    for key, name in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if key not in config.preprocessor and name in size:
            config.preprocessor[key] = size[name]
    return config


def model_class():
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean: the tower is the patch
    embedding, the learned position table and the blocks; the projector the final merger and the
    DeepStack mergers."""
    visual = model.model.visual
    return {
        "vision": [visual.patch_embed, visual.pos_embed, visual.blocks],
        "projector": [visual.merger, visual.deepstack_merger_list],
        "language": [model.model.language_model, model.lm_head],
    }


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """`Qwen3VLModel.get_rope_index` returns position_ids [3, b, s] and rope_deltas [b, 1] of the
    real shapes and dtypes without reading values (as Qwen2-VL's, `qwen2_vl.host_patches`)."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    cls = modeling_qwen3_vl.Qwen3VLModel
    saved = cls.get_rope_index

    def get_rope_index(self, input_ids, *args, **kwargs):
        b, s = input_ids.shape
        position_ids = torch.zeros(3, b, s, dtype=input_ids.dtype, device=input_ids.device)
        return position_ids, torch.zeros(b, 1, dtype=torch.long, device=input_ids.device)

    cls.get_rope_index = get_rope_index
    try:
        yield [ROPE_INDEX_SHAPES_ONLY]
    finally:
        cls.get_rope_index = saved


image_grid = qwen2_vl.image_grid
make_batch = qwen2_vl.make_batch
