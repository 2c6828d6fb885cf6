"""Qwen2-VL (Qwen2VLForConditionalGeneration) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`), plus
`HOST_VALUES`, the batch keys whose values the model reads on the host (the harness makes
them fake tensors that carry their values), `checkpoint_module(model, name)`, the module
whose `gradient_checkpointing_enable` turns checkpointing on for an experiment module name,
and `host_patches()`, a context manager for what cannot run on fake tensors (it yields the
names of what it patched, which the record lists under `emulation`).

The batch is what Qwen2VLProcessor produces for one image per sample at the experiment's
`image_size` (default: the spec's): `pixel_values` [patches, C * 2 * 14 * 14] (each patch
flattened with its temporal copy, the image repeated to temporal_patch_size frames),
`image_grid_thw` [images, 3] = (1, h / 14, w / 14) after smart_resize, `input_ids` of exactly
seq_len positions with (h / 28) * (w / 28) image tokens per image first in every sample,
`mm_token_type_ids` (1 at image tokens), labels with the image tokens at -100.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import torch

from ...pipeline.resolve import ImageResize
from ..experiment import ExperimentError
from . import image_first_tokens, without_cache

IMAGE_TOKEN_TYPE = 1  # mm_token_type_ids: text 0, image 1, video 2 (Qwen2VLModel.get_rope_index)
VIDEO_TOKEN_TYPE = 2
# Qwen2VLImageProcessor defaults (image_processing_qwen2_vl.py), used when the
# preprocessor_config.json beside the config does not say.
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280

# image_grid_thw is read on the host: per-image patch positions, cu_seqlens and its split
# (sdpa and eager attend image by image), and the split of the merged features.
HOST_VALUES = ("image_grid_thw", "video_grid_thw")
ROPE_INDEX_SHAPES_ONLY = "mrope-position-ids-shapes-only"


def load_config(config_path: Path):
    """Qwen2VLConfig from a config.json, with the KV cache off (training)."""
    from transformers import Qwen2VLConfig

    return without_cache(Qwen2VLConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    from transformers import Qwen2VLForConditionalGeneration

    return Qwen2VLForConditionalGeneration


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean.

    NB: the merger lives inside `model.model.visual`; the vision tower is its patch embedding
    and blocks (the rotary table has no parameters).
    """
    visual = model.model.visual
    return {
        "vision": [visual.patch_embed, visual.blocks],
        "projector": [visual.merger],
        "language": [model.model.language_model, model.lm_head],
    }


def checkpoint_module(model, name: str) -> torch.nn.Module:
    """The PreTrainedModel whose checkpointing covers the experiment module's layers."""
    return {"vision": model.model.visual, "language": model.model.language_model}[name]


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """`get_rope_index` returns tensors of the real shapes and dtypes without reading values.

    NB: the real one walks each sample's token types and image grids in Python (`.tolist()`,
    `torch.tensor` of 0-d tensors), which fake tensors cannot; what reaches the GPU is
    position_ids [3, b, s] in input_ids' dtype and rope_deltas [b, 1] int64, both allocated
    here as the real ones are; its per-sample temporaries are a few x s int64 values.
    """
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    with rope_index_by_shape(modeling_qwen2_vl.Qwen2VLModel, modeling_qwen2_5_vl.Qwen2_5_VLModel):
        yield [ROPE_INDEX_SHAPES_ONLY]


@contextlib.contextmanager
def rope_index_by_shape(*classes) -> Iterator[None]:
    """Each class's `get_rope_index` (an M-RoPE model: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4.1V)
    replaced, while the block runs, by one that returns position_ids [3, b, s] in input_ids'
    dtype and rope_deltas [b, 1] int64 without reading any value (see `host_patches`)."""
    saved = [c.get_rope_index for c in classes]

    def get_rope_index(self, input_ids, *args, **kwargs):
        b, s = input_ids.shape
        position_ids = torch.zeros(3, b, s, dtype=input_ids.dtype, device=input_ids.device)
        return position_ids, torch.zeros(b, 1, dtype=torch.long, device=input_ids.device)

    for c in classes:
        c.get_rope_index = get_rope_index
    try:
        yield
    finally:
        for c, original in zip(classes, saved):
            c.get_rope_index = original


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' `smart_resize` (image_processing_qwen2_vl.py), as the estimator applies it."""
    return ImageResize(factor, min_pixels, max_pixels).apply(height, width)


def image_grid(config, image_size: list[int]) -> tuple[int, int]:
    """(h / patch, w / patch) of one image after the processor's smart_resize."""
    v = config.vision_config
    p = config.preprocessor
    factor = v.patch_size * v.spatial_merge_size
    h, w = smart_resize(image_size[0], image_size[1], factor, p.get("min_pixels", DEFAULT_MIN_PIXELS), p.get("max_pixels", DEFAULT_MAX_PIXELS))
    return h // v.patch_size, w // v.patch_size


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The processor's batch: each sample's image tokens first, then its video tokens, then
    text. A video of F frames at image_size is what Qwen2VLVideoProcessor makes of it: its
    frames padded with the last one to a multiple of temporal_patch_size, grid_t = F / that,
    pixel_values_videos [videos x grid_t x h x w patches, C x T x p x p] and video_grid_thw
    rows (grid_t, h, w)."""
    b, s, images = exp["micro_batch"], exp["seq_len"], exp["images_per_sample"]
    videos, frames = exp.get("videos_per_sample") or 0, exp.get("video_frames") or 0
    if not exp.get("image_size"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: Qwen2-VL needs image_size [h, w]")
    v = config.vision_config
    gh, gw = image_grid(config, exp["image_size"])
    per_image = gh * gw // v.spatial_merge_size**2
    grid_t = -(-frames // v.temporal_patch_size)
    n_image, n_video = images * per_image, videos * grid_t * per_image
    input_ids, labels = image_first_tokens(exp, n_image + n_video, config.image_token_id)
    input_ids[:, n_image : n_image + n_video] = config.video_token_id
    mm_token_type_ids = torch.zeros((b, s), dtype=torch.long)
    mm_token_type_ids[:, :n_image] = IMAGE_TOKEN_TYPE
    mm_token_type_ids[:, n_image : n_image + n_video] = VIDEO_TOKEN_TYPE
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None, "mm_token_type_ids": mm_token_type_ids}
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size**2
    if images:
        batch["pixel_values"] = torch.zeros(b * images * gh * gw, patch_dim, dtype=dtype)
        batch["image_grid_thw"] = torch.tensor([[1, gh, gw]] * (b * images), dtype=torch.long)
    if videos:
        batch["pixel_values_videos"] = torch.zeros(b * videos * grid_t * gh * gw, patch_dim, dtype=dtype)
        batch["video_grid_thw"] = torch.tensor([[grid_t, gh, gw]] * (b * videos), dtype=torch.long)
    return batch
