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

from . import without_cache
from .mistral3 import checkpoint_module, module_groups, pixtral_batch, pixtral_resized

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
    """The image size the tower sees: PixtralImageProcessor's resize with the patch as the unit
    (no merger)."""
    return pixtral_resized(config, height, width, config.vision_config.patch_size)


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, image_sizes, input_ids (each sample's image tokens first) and labels."""
    return pixtral_batch(config, exp, dtype, config.vision_config.patch_size, "LLaVA with a Pixtral tower")
