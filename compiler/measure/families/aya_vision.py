"""Aya Vision (AyaVisionForConditionalGeneration) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`), plus
`checkpoint_module(model, name)`.

The batch is what AyaVisionProcessor produces for `images_per_sample` images per sample at the
experiment's `image_size` (default: one tile): GotOcr2ImageProcessor (crop_to_patches) cuts each
image into the tile grid whose aspect ratio is closest to the image's (1 to max_patches tiles,
larger grids of the same ratio while the image covers over half of them) and adds a thumbnail
when there is more than one tile (InternVL's search, the expression function `crop_to_patches`); `pixel_values`
[b * images * tiles, C, size, size]; `input_ids` of exactly seq_len positions with
(size / patch)^2 / downsample_factor^2 image tokens per tile first in every sample; labels with
the image tokens at -100.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import NormalInit, image_first_tokens, without_cache
from .internvl import crop_tiles
from .llava import module_groups  # noqa: F401  (the same vision_tower / multi_modal_projector / language_model layout)


def load_config(config_path: Path):
    """AyaVisionConfig from a config.json, with the KV cache off (training)."""
    import json

    from transformers import AyaVisionConfig

    return without_cache(AyaVisionConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    return NormalInit("AyaVisionForConditionalGeneration")


def checkpoint_module(model, name: str) -> torch.nn.Module:
    """The PreTrainedModel whose checkpointing covers the experiment module's layers."""
    return {"vision": model.model.vision_tower, "language": model.model.language_model}[name]


def tokens_per_tile(config) -> int:
    """(364 / 14)^2 / 2^2 = 169 for aya-vision-8b; (512 / 16)^2 / 2^2 = 256 for
    command-a-vision-07-2025."""
    v = config.vision_config
    return (v.image_size // v.patch_size) ** 2 // (config.downsample_factor**2)


def tiles_per_image(config, image_size: list[int] | None) -> int:
    """Tiles of one image, the thumbnail included (crop_image_to_patches); one without a size."""
    return crop_tiles(config.preprocessor, config.vision_config.image_size, image_size) if image_size else 1


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return tiled_batch(config, exp, dtype, tiles_per_image(config, exp.get("image_size")))


def tiled_batch(config, exp: dict, dtype: torch.dtype, tiles: int) -> dict[str, torch.Tensor]:
    """`tiles` tiles per image (the processor's count), tokens_per_tile image tokens each, first
    in every sample; the tiles as pixel_values (Aya Vision and Command A Vision alike)."""
    b, images = exp["micro_batch"], exp["images_per_sample"]
    v = config.vision_config
    per_tile = tokens_per_tile(config)
    input_ids, labels = image_first_tokens(exp, images * tiles * per_tile, config.image_token_id, f" ({images} x {tiles} tiles x {per_tile})")
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        batch["pixel_values"] = torch.zeros(b * images * tiles, v.num_channels, v.image_size, v.image_size, dtype=dtype)
    return batch
