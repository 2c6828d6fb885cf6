"""MiniCPM-V 4.6 (MiniCPMV4_6ForConditionalGeneration) for the measuring harness.

Contract: as `qwen2_vl.py` (`load_config`, `model_class`, `module_groups`, `make_batch`,
`HOST_VALUES`, `checkpoint_module`, `host_patches`).

The batch is what MiniCPMV4_6Processor produces for `images_per_sample` images per sample at
the experiment's `image_size` (default 448 x 448): each image its source image (find_best_resize,
the area scaled to scale_resolution^2 at the image's aspect ratio, each side rounded to a
multiple of patch x 4) and, above scale_resolution^2 pixels with slice_mode on, the grid of
slices get_sliced_grid and get_refine_size make (the expression functions' statement of them,
`compiler.library.expr_python.minicpmv_slicing`); `pixel_values` [1, 3, 14, patches x 14] (every
slice of the micro-batch packed into one NaViT row, MiniCPMV4_6ImageProcessor.reshape_by_patch),
`target_sizes` [slices, 2] int32 (h / 14, w / 14), `input_ids` of exactly seq_len positions with
each image's patches / 16 image tokens first in every sample (the <image> and <slice> markers
are text the batch leaves out), labels with those at -100.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import torch

from ...library.expr_python import minicpmv_slicing
from ..experiment import ExperimentError
from . import image_first_tokens, without_cache

# MiniCPMV4_6ImageProcessor defaults (image_processing_minicpmv4_6.py), used when the
# preprocessor_config.json beside the config does not say.
DEFAULT_SCALE_RESOLUTION = 448
DEFAULT_MAX_SLICE_NUMS = 9
# "16x": the window-attention merger after layer insert_layer_id and the merger's MLP each merge 2 x 2
MERGE_FACTOR = 4

# target_sizes is read on the host: the position ids per slice, cu_seqlens and the split of
# q, k and v per slice (sdpa and eager), the window index of the vit_merger, the merger's views.
HOST_VALUES = ("target_sizes",)
WINDOW_INDEX_ON_HOST = "vision-window-index-on-host"
PLACEHOLDER_CHECK_SKIPPED = "placeholder-mask-count-check-skipped"


def load_config(config_path: Path):
    """MiniCPMV4_6Config from a config.json, with the KV cache off (training)."""
    from transformers import MiniCPMV4_6Config

    return without_cache(MiniCPMV4_6Config(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    from transformers import MiniCPMV4_6ForConditionalGeneration

    return MiniCPMV4_6ForConditionalGeneration


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean: the tower is the whole
    MiniCPMV4_6VisionModel (its window-attention vit_merger included), the projector the merger."""
    return {
        "vision": [model.model.vision_tower],
        "projector": [model.model.merger],
        "language": [model.model.language_model, model.lm_head],
    }


def checkpoint_module(model, name: str) -> torch.nn.Module:
    """The PreTrainedModel whose checkpointing covers the experiment module's layers."""
    return {"vision": model.model.vision_tower, "language": model.model.language_model}[name]


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """The vit_merger's `get_vision_window_index` run on the host, as Qwen2.5-VL's
    (`qwen2_5_vl.host_patches`: a boolean-mask selection whose output shape a fake tensor
    cannot know): the same function on a real CPU copy of the (1, h, w) grid, its window index
    a host tensor (not counted; its device copy is patches x 8 B) and its cu_seqlens an int32
    device tensor of windows + 1 values (counted, through a clone under the tracer).

    And `MiniCPMV4_6Model.get_placeholder_mask` without its count check: the check's argument
    `inputs_embeds[special_mask].numel()` is a boolean-mask gather (aten.nonzero) whose output
    shape a fake tensor cannot know. On a GPU it is a transient of the image positions' values
    and their int64 [image tokens x hidden, 3] indices, freed at once (about 1.6 MiB per 64
    image tokens of a 1024-wide model), outside any phase peak; the mask returned is the same
    (`input_ids == image_token_id`, expanded)."""
    from transformers.models.minicpmv4_6 import modeling_minicpmv4_6

    from .qwen2_5_vl import host_window_index

    original = modeling_minicpmv4_6.get_vision_window_index
    get_vision_window_index = host_window_index(original, "target_sizes reached the vit_merger")

    def get_placeholder_mask(self, input_ids, inputs_embeds, features, token_id):
        special_mask = input_ids == token_id
        return special_mask.unsqueeze(-1).expand_as(inputs_embeds).to(inputs_embeds.device)

    model_class = modeling_minicpmv4_6.MiniCPMV4_6Model
    original_mask = model_class.get_placeholder_mask
    modeling_minicpmv4_6.get_vision_window_index = get_vision_window_index
    model_class.get_placeholder_mask = get_placeholder_mask
    try:
        yield [WINDOW_INDEX_ON_HOST, PLACEHOLDER_CHECK_SKIPPED]
    finally:
        modeling_minicpmv4_6.get_vision_window_index = original
        model_class.get_placeholder_mask = original_mask


def slice_sizes(config, image_size: list[int] | None) -> list[tuple[int, int]]:
    """(height, width) in pixels of each piece the processor makes of one image: its source image,
    then its slices, as MiniCPMV4_6ImageProcessor._preprocess cuts it (image_processing_minicpmv4_6.py)."""
    pre = config.preprocessor
    scale = pre.get("scale_resolution", DEFAULT_SCALE_RESOLUTION)
    max_slices = pre.get("max_slice_nums", DEFAULT_MAX_SLICE_NUMS) if pre.get("slice_mode", True) else 0
    h, w = image_size or (scale, scale)
    unit = config.vision_config.patch_size * MERGE_FACTOR
    source, grid, piece = minicpmv_slicing(h, w, scale, unit, max(max_slices, 1))
    if piece is None or max_slices == 0:
        return [source]
    return [source] + [piece] * (grid[0] * grid[1])


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values [1, C, 14, slices x patches x 14], target_sizes, input_ids (image tokens first) and labels."""
    if exp.get("videos_per_sample"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: MiniCPM-V video input is not measured")
    b, images = exp["micro_batch"], exp["images_per_sample"]
    patch = config.vision_config.patch_size
    grids = [(h // patch, w // patch) for h, w in slice_sizes(config, exp.get("image_size"))]
    patches = sum(gh * gw for gh, gw in grids)
    per_image = patches // (MERGE_FACTOR * MERGE_FACTOR)
    input_ids, labels = image_first_tokens(exp, images * per_image, config.image_token_id)
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        batch["pixel_values"] = torch.zeros(1, config.vision_config.num_channels, patch, b * images * patches * patch, dtype=dtype)
        batch["target_sizes"] = torch.tensor([list(g) for g in grids] * (b * images), dtype=torch.int32)
    return batch
