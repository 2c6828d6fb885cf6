"""Mistral 3.1 / 3.2 (Mistral3ForConditionalGeneration) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`), plus
`HOST_VALUES` (the batch keys the model reads on the host) and `checkpoint_module`.

The batch is what PixtralProcessor makes for training: `images_per_sample` images per sample
at the experiment's `image_size` (default: the spec's), each resized as the processor does
(longest edge down to size.longest_edge, then each side up to a multiple of patch x merge),
`pixel_values` [b x images, 3, H, W] in the compute dtype, `image_sizes` [b x images, 2] int64,
`input_ids` of exactly seq_len positions whose first rows x (cols + 1) are the image's
[IMG] tokens with an [IMG_BREAK] after every row ([IMG_END] after the last), labels with those
at -100.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..experiment import ExperimentError
from . import image_first_tokens, without_cache

# the image is read on the host: the tower slices each image's patches, the merger its grid
HOST_VALUES = ("image_sizes",)
IMG_BREAK_ID = 12  # [IMG_BREAK] and [IMG_END] in Mistral's tekken vocabulary (text tokens to the model)
IMG_END_ID = 13


def load_config(config_path: Path):
    """Mistral3Config from a config.json, with the KV cache off (training).

    NB: Mistral3Config's tie_word_embeddings defaults to true and the released configs do not
    set it, but their checkpoints carry lm_head apart from embed_tokens, and from_pretrained
    leaves tied weights that both differ untied; a model built from the config alone would tie
    them. The text config's value (false) is what a loaded model has.
    """
    from transformers import Mistral3Config

    raw = json.loads(Path(config_path).read_text())
    config = Mistral3Config(**raw)
    if "tie_word_embeddings" not in raw:
        config.tie_word_embeddings = bool(config.text_config.tie_word_embeddings)
    return without_cache(config, config_path)


def model_class():
    from transformers import Mistral3ForConditionalGeneration

    return Mistral3ForConditionalGeneration


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean."""
    return {
        "vision": [model.model.vision_tower],
        "projector": [model.model.multi_modal_projector],
        "language": [model.model.language_model, model.lm_head],
    }


def checkpoint_module(model, name: str) -> torch.nn.Module:
    """The PreTrainedModel whose checkpointing covers the experiment module's layers."""
    return {"vision": model.model.vision_tower, "language": model.model.language_model}[name]


def longest_edge(config) -> int:
    """The processor's size.longest_edge (preprocessor_config.json; the tower's image_size without one)."""
    size = config.preprocessor.get("size") or {}
    return int(size.get("longest_edge") or config.vision_config.image_size)


def pixtral_resized(config, height: int, width: int, unit: int) -> tuple[int, int]:
    """The image size a Pixtral tower sees: PixtralImageProcessor's get_resize_output_image_size
    (the longest edge down to size.longest_edge, then each side up to a multiple of `unit`), in
    integer arithmetic."""
    edge = longest_edge(config)
    if max(height, width) > edge:
        height, width = height * edge // max(height, width), width * edge // max(height, width)
    return -(-height // unit) * unit, -(-width // unit) * unit


def resized(config, height: int, width: int) -> tuple[int, int]:
    """The image size the tower sees: the unit is patch x spatial_merge_size (what
    PixtralProcessor passes)."""
    return pixtral_resized(config, height, width, config.vision_config.patch_size * config.spatial_merge_size)


def pixtral_batch(config, exp: dict, dtype: torch.dtype, unit: int, model: str) -> dict[str, torch.Tensor]:
    """pixel_values, image_sizes, input_ids (each sample's image tokens first) and labels of a
    Pixtral tower whose image token stands for a `unit` x `unit` square of pixels."""
    b, images = exp["micro_batch"], exp["images_per_sample"]
    if images and not exp.get("image_size"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: {model} needs image_size [h, w]")
    v = config.vision_config
    h, w = pixtral_resized(config, *exp["image_size"], unit) if images else (0, 0)
    rows, cols = h // unit, w // unit
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


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, image_sizes, input_ids (each sample's image tokens first) and labels."""
    return pixtral_batch(config, exp, dtype, config.vision_config.patch_size * config.spatial_merge_size, "Mistral 3")
