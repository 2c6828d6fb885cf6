"""LLaVA with a Pixtral vision tower (LlavaForConditionalGeneration, vision_config model_type
"pixtral": mistral-community/pixtral-12b) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`), plus
`HOST_VALUES` and `checkpoint_module` as `mistral3.py`.

The batch is what PixtralProcessor makes for training, as for Mistral 3 but with no patch
merger: `images_per_sample` images per sample at the experiment's `image_size`, each resized
as the processor does (longest edge down to size.longest_edge, then each side up to a multiple
of the patch), `pixel_values` [b x images, 3, H, W] in the compute dtype, `image_sizes`
[b x images, 2] int64, `input_ids` of exactly seq_len positions whose first rows x (cols + 1)
are the image's [IMG] tokens with an [IMG_BREAK] after every row ([IMG_END] after the last),
labels with those at -100.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..experiment import ExperimentError
from . import image_first_tokens, without_cache
from .mistral3 import IMG_BREAK_ID, IMG_END_ID, checkpoint_module, module_groups

__all__ = ["HOST_VALUES", "checkpoint_module", "load_config", "make_batch", "model_class", "module_groups"]

# the image is read on the host: the tower slices each image's patches, the model splits the features
HOST_VALUES = ("image_sizes",)


def load_config(config_path: Path):
    """LlavaConfig from a config.json, with the KV cache off (training) and the processor's
    settings attached."""
    from transformers import LlavaConfig

    return without_cache(LlavaConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    from transformers import LlavaForConditionalGeneration

    return LlavaForConditionalGeneration


def resized(config, height: int, width: int) -> tuple[int, int]:
    """The image size the tower sees: PixtralImageProcessor's get_resize_output_image_size with
    the patch as the unit (no merger), in integer arithmetic."""
    size = config.preprocessor.get("size") or {}
    edge = int(size.get("longest_edge") or config.vision_config.image_size)
    unit = config.vision_config.patch_size
    if max(height, width) > edge:
        height, width = height * edge // max(height, width), width * edge // max(height, width)
    return -(-height // unit) * unit, -(-width // unit) * unit


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, image_sizes, input_ids (each sample's image tokens first) and labels."""
    b, images = exp["micro_batch"], exp["images_per_sample"]
    if images and not exp.get("image_size"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: LLaVA with a Pixtral tower needs image_size [h, w]")
    v = config.vision_config
    h, w = resized(config, *exp["image_size"]) if images else (0, 0)
    rows, cols = h // v.patch_size, w // v.patch_size
    input_ids, labels = image_first_tokens(exp, images * rows * (cols + 1), config.image_token_id)
    for i in range(images):  # [IMG] x cols then [IMG_BREAK] per row, [IMG_END] last
        start = i * rows * (cols + 1)
        for r in range(rows):
            input_ids[:, start + r * (cols + 1) + cols] = IMG_BREAK_ID if r < rows - 1 else IMG_END_ID
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        batch["pixel_values"] = torch.zeros(b * images, v.num_channels, h, w, dtype=dtype)
        batch["image_sizes"] = torch.tensor([[h, w]] * (b * images), dtype=torch.long)
    return batch
