"""Llama 3.2 Vision (MllamaForConditionalGeneration) for the measuring harness.

The batch is what MllamaProcessor makes of one image per sample (or `images_per_sample`): one
`<|image|>` token per image at the start of input_ids (the image is not expanded into the text:
the language model's cross-attention layers read the tower's output instead), pixel_values
[b, images, max_image_tiles, 3, tile, tile] padded to max_image_tiles whatever the image's own
tile count (pad_batches_and_tiles), aspect_ratio_ids [b, images], aspect_ratio_mask [b, images,
max_image_tiles] and cross_attention_mask [b, s, images, max_image_tiles] (int64), which lets
every text position from the image token on attend to the image's real tiles.

The image's tiles follow the processor's get_optimal_tiled_canvas for the experiment's
`image_size` (default one tile, the processor's size): only the masks' values change with
it, never a shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import image_first_tokens, without_cache


def load_config(config_path: Path):
    """MllamaConfig from a config.json, with the KV cache off (training)."""
    from transformers import MllamaConfig

    return without_cache(MllamaConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    from transformers import MllamaForConditionalGeneration

    return MllamaForConditionalGeneration


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean."""
    return {
        "vision": [model.model.vision_model],
        "projector": [model.model.multi_modal_projector],
        "language": [model.model.language_model, model.lm_head],
    }


def checkpoint_module(model, name: str) -> torch.nn.Module:
    """The PreTrainedModel whose checkpointing covers the experiment module's layers."""
    return {"vision": model.model.vision_model, "language": model.model.language_model}[name]


def tile_grid(config, image_size: list[int] | None) -> tuple[int, int]:
    """(rows, columns) of tiles the processor cuts an image of `image_size` [h, w] into
    (MllamaImageProcessor.resize: get_optimal_tiled_canvas); one tile without a size."""
    from transformers.models.mllama.image_processing_pil_mllama import get_optimal_tiled_canvas

    tile = (config.preprocessor.get("size") or {}).get("height") or config.vision_config.image_size
    max_tiles = config.preprocessor.get("max_image_tiles") or config.vision_config.max_num_tiles
    if not image_size:
        return 1, 1
    h, w = get_optimal_tiled_canvas(image_height=image_size[0], image_width=image_size[1], max_image_tiles=max_tiles, tile_size=tile)
    return int(h) // tile, int(w) // tile


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """input_ids (one image token per image first in every sample), labels, pixel_values padded
    to max_num_tiles tiles, aspect_ratio_ids / aspect_ratio_mask and cross_attention_mask."""
    from transformers.models.mllama.image_processing_pil_mllama import get_all_supported_aspect_ratios

    b, s, images = exp["micro_batch"], exp["seq_len"], exp["images_per_sample"]
    vision = config.vision_config
    input_ids, labels = image_first_tokens(exp, images, config.image_token_id)
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if not images:
        return batch
    tiles = vision.max_num_tiles
    rows, cols = tile_grid(config, exp.get("image_size"))
    ratio_id = get_all_supported_aspect_ratios(tiles).index((rows, cols)) + 1
    size = vision.image_size
    batch["pixel_values"] = torch.zeros(b, images, tiles, vision.num_channels, size, size, dtype=dtype)
    batch["aspect_ratio_ids"] = torch.full((b, images), ratio_id, dtype=torch.long)
    batch["aspect_ratio_mask"] = torch.zeros(b, images, tiles, dtype=torch.long)
    batch["aspect_ratio_mask"][:, :, : rows * cols] = 1
    mask = torch.zeros(b, s, images, tiles, dtype=torch.long)
    for i in range(images):
        # get_cross_attention_token_mask: consecutive image tokens all attend to the text after them
        mask[:, i:, i, : rows * cols] = 1
    batch["cross_attention_mask"] = mask
    return batch
