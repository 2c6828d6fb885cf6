"""Ovis2 (Ovis2ForConditionalGeneration) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`), plus
`checkpoint_module(model, name)` and `HOST_VALUES`.

The batch is what Ovis2Processor produces for `images_per_sample` images per sample at the
experiment's `image_size` (default: one tile): Ovis2ImageProcessor (crop_to_patches with the
covering-area grid, the expression function `covering_tiles`) cuts each image into the grid of
fewest tiles covering over 90 % of it (at most max_patches) and puts a thumbnail first when
there is more than one tile; `pixel_values` [b * images * tiles, C, size, size]; `input_ids` of
exactly seq_len positions whose first positions are every image's placeholder: <IMG_START>, the
image tokens (<IMG_ATOM>, (size / patch / hidden_stride)^2 per tile), <IMG_GRID>, and, for a
tiled image, one <IMG_COL> and one <IMG_ROW> (the processor puts one between neighbouring tiles:
how many does not change what is allocated), then <IMG_END>; labels ignore all of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...library.expr_python import FUNCTIONS
from . import IGNORE_INDEX, NormalInit, image_first_tokens, without_cache

# Ovis2ImageProcessor's defaults (image_processing_ovis2.py), used when preprocessor_config.json
# does not say
DEFAULT_MAX_PATCHES = 12

# Ovis2Model.forward tests every visual indicator id for presence (`if mask.any():`), a value
# the host reads: the ids must be known there, as on a GPU the test syncs.
HOST_VALUES = ("input_ids",)


def load_config(config_path: Path):
    """Ovis2Config from a config.json, with the KV cache off (training)."""
    from transformers import Ovis2Config

    return without_cache(Ovis2Config(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    return NormalInit("Ovis2ForConditionalGeneration")


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean: the visual tokenizer's
    head and the visual embedding table are the projector."""
    tower = model.model.vision_tower
    return {
        "vision": [tower.transformer],
        "projector": [tower.head_linear, tower.head_norm, model.model.visual_embeddings_table],
        "language": [model.model.language_model, model.lm_head],
    }


def checkpoint_module(model, name: str) -> torch.nn.Module:
    """The PreTrainedModel whose checkpointing covers the experiment module's layers."""
    return {"vision": model.model.vision_tower, "language": model.model.language_model}[name]


def tokens_per_tile(config) -> int:
    """(448 / 14 / 2)^2 = 256 for the released checkpoints (the merged grid, padded up)."""
    v = config.vision_config
    side = -(-(v.image_size // v.patch_size) // v.hidden_stride)
    return side * side


def tiles_per_image(config, image_size: list[int] | None) -> int:
    """Tiles of one image, the thumbnail included (crop_image_to_patches); one without a size."""
    p = config.preprocessor
    max_patches = p.get("max_patches", DEFAULT_MAX_PATCHES)
    if not image_size or not p.get("crop_to_patches", False) or max_patches <= 1:
        return 1
    tile = (p.get("size") or {}).get("height", config.vision_config.image_size)
    return FUNCTIONS["covering_tiles"](image_size[0], image_size[1], tile, max_patches)


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    b, images = exp["micro_batch"], exp["images_per_sample"]
    v = config.vision_config
    tiles = tiles_per_image(config, exp.get("image_size"))
    start, grid, col, row, end = config.visual_indicator_token_ids
    placeholder = [start] + [config.image_token_id] * tokens_per_tile(config) + [grid]
    placeholder += [config.image_token_id] * (tokens_per_tile(config) * (tiles - 1))
    placeholder += ([col, row] if tiles > 1 else []) + [end]
    n = images * len(placeholder)
    input_ids, labels = image_first_tokens(exp, n, config.image_token_id, f" ({images} x {tiles} tiles x {tokens_per_tile(config)} and markers)")
    if images:
        input_ids[:, :n] = torch.tensor(placeholder * images, dtype=torch.long)
        labels[:, :n] = IGNORE_INDEX
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        batch["pixel_values"] = torch.zeros(b * images * tiles, v.num_channels, v.image_size, v.image_size, dtype=dtype)
    return batch
