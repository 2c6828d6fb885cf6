"""LLaVA-NeXT (LlavaNextForConditionalGeneration, anyres tiling) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`), plus
`HOST_VALUES` (`image_sizes`: the model reads each image's size on the host to pick its tile
grid and unpad its features). The batch is what LlavaNextProcessor produces for one image
per sample of the experiment's `image_size` [h, w]: `pixel_values` [b, 1 + tiles, C, 336,
336] (the base image and the tiles of the best grid pinpoint), `image_sizes` [b, 2] = (h, w),
`input_ids` of exactly seq_len positions whose first positions per sample are the image
tokens, as many as the model's `pack_image_features` makes, and labels with those at -100.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..experiment import ExperimentError
from . import image_first_tokens

HOST_VALUES = ("image_sizes",)


def load_config(config_path: Path):
    """LlavaNextConfig from a config.json, with the KV cache off (training)."""
    from transformers import LlavaNextConfig

    config = LlavaNextConfig(**json.loads(Path(config_path).read_text()))
    config.text_config.use_cache = False
    return config


def model_class():
    from transformers import LlavaNextForConditionalGeneration

    return LlavaNextForConditionalGeneration


def module_groups(model) -> dict[str, list]:
    """Experiment module names -> the submodules (and the image_newline parameter) they mean."""
    return {
        "vision": [model.model.vision_tower],
        "projector": [model.model.multi_modal_projector, model.model.image_newline],
        "language": [model.model.language_model, model.lm_head],
    }


def checkpoint_module(model, name: str) -> torch.nn.Module:
    return {"vision": model.model.vision_tower, "language": model.model.language_model}[name]


def anyres(config, image_size: list[int]) -> tuple[int, int]:
    """(crops, image tokens) of one image of `image_size` [h, w], by the model's own code.

    Crops: `image_size_to_num_patches` (the base image plus the tiles of the grid pinpoint
    `select_best_resolution` picks). Tokens: the base image's features, then the tiles'
    features laid out as one picture, unpadded to the image's aspect ratio (`unpad_image`,
    run on a meta tensor) with one image_newline per row (`pack_image_features`).
    """
    from transformers.models.llava_next.modeling_llava_next import (
        get_anyres_image_grid_shape,
        image_size_to_num_patches,
        unpad_image,
    )

    v = config.vision_config
    side = v.image_size // v.patch_size
    base = side * side + (1 if config.vision_feature_select_strategy == "full" else 0)
    crops = image_size_to_num_patches(list(image_size), config.image_grid_pinpoints, v.image_size)
    rows, cols = get_anyres_image_grid_shape(list(image_size), config.image_grid_pinpoints, v.image_size)
    grid = torch.empty(1, rows * side, cols * side, device="meta")
    h, w = unpad_image(grid, list(image_size)).shape[1:]
    return crops, base + h * (w + 1)


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return anyres_batch(config, exp, dtype, anyres, "LLaVA-NeXT")


def anyres_batch(config, exp: dict, dtype: torch.dtype, crops_and_tokens, model: str) -> dict[str, torch.Tensor]:
    """One image per sample cut into AnyRes crops: `crops_and_tokens(config, image_size)` gives
    (crops, image tokens) as the model's processor counts them (`anyres` here, LLaVA-OneVision's
    its own)."""
    b, images = exp["micro_batch"], exp["images_per_sample"]
    if images not in (0, 1):
        raise ExperimentError(f"experiment {exp['experiment']!r}: {model} is measured with one image per sample")
    if images and not exp.get("image_size"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: {model} needs image_size [h, w]")
    crops, n_image = crops_and_tokens(config, exp["image_size"]) if images else (0, 0)
    input_ids, labels = image_first_tokens(exp, n_image, config.image_token_id)
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        v = config.vision_config
        batch["pixel_values"] = torch.zeros(b, crops, v.num_channels, v.image_size, v.image_size, dtype=dtype)
        batch["image_sizes"] = torch.tensor([list(exp["image_size"])] * b, dtype=torch.long)
    return batch
