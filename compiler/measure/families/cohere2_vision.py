"""Command A Vision (Cohere2VisionForConditionalGeneration) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`), plus
`checkpoint_module(model, name)`.

The batch is what Cohere2VisionProcessor produces for `images_per_sample` images per sample at
the experiment's `image_size` (default: one tile): Cohere2VisionImageProcessor (crop_to_patches)
cuts each image into the grid of at most max_patches tiles its get_optimal_tiled_canvas picks
(the expression function `canvas_tiles`, which restates it) and adds a thumbnail when there is
more than one tile; `pixel_values` [b * images * tiles, C, size, size]; `input_ids` of exactly
seq_len positions with patch_size^2 image tokens per tile first in every sample; labels with the
image tokens at -100.
"""

from __future__ import annotations

from pathlib import Path

import torch

from compiler.library.expr_python import FUNCTIONS

from . import NormalInit, without_cache
from .aya_vision import checkpoint_module, tiled_batch, tokens_per_tile  # noqa: F401  (the same layout, tokens and batch)
from .llava import module_groups  # noqa: F401  (the same vision_tower / multi_modal_projector / language_model layout)


def load_config(config_path: Path):
    """Cohere2VisionConfig from a config.json, with the KV cache off (training)."""
    import json

    from transformers import Cohere2VisionConfig

    return without_cache(Cohere2VisionConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    return NormalInit("Cohere2VisionForConditionalGeneration")


def tiles_per_image(config, image_size: list[int] | None) -> int:
    """Tiles of one image, the thumbnail included (crop_image_to_patches); one without a size."""
    if not image_size:
        return 1
    p = config.preprocessor
    tile = p.get("size", {}).get("height", config.vision_config.image_size)
    return FUNCTIONS["canvas_tiles"](image_size[0], image_size[1], tile, p.get("max_patches", 12))


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return tiled_batch(config, exp, dtype, tiles_per_image(config, exp.get("image_size")))
