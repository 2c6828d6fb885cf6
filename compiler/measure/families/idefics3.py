"""Idefics3 and SmolVLM v1 (Idefics3ForConditionalGeneration) for the measuring harness.

Contract: as `qwen2_vl.py` (`load_config`, `model_class`, `module_groups`, `make_batch`,
`HOST_VALUES`, `checkpoint_module`, `host_patches`).

The batch is what Idefics3Processor produces for `images_per_sample` images per sample at the
experiment's `image_size` (default: square, which splits into the most tiles): every image's
longest edge resized to size.longest_edge, each side rounded up to whole tiles of
max_image_size.longest_edge, split, plus the global tile; `pixel_values` [b, images x tiles,
3, tile, tile] in the compute dtype (no tile all zero: an all-zero tile is a padding image that
get_image_features drops), `pixel_attention_mask` [b, images x tiles, tile, tile] int64 ones
(the processor pads with it), `input_ids` of exactly seq_len positions whose first
images x tiles x image_seq_len are the image token, labels with those at -100.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Iterator

import torch

from . import image_first_tokens, without_cache

# Idefics3ImageProcessor defaults (image_processing_idefics3.py), used when neither the
# preprocessor_config.json beside the config nor the vision config says.
DEFAULT_LONGEST_EDGE = 4 * 364
DEFAULT_TILE = 364

# get_image_features drops padding images with a boolean index computed from the pixel values
# (pixel_values[real_images_inds]): the values must be known on the host, as on a GPU the
# index's nonzero syncs; the patch mask derived from pixel_attention_mask decides whether the
# tower's attention mask can be skipped.
HOST_VALUES = ("pixel_values", "pixel_attention_mask")
BIDIRECTIONAL_MASK_SKIP = "bidirectional-mask-skip-reads-host-values"
# Elements a host-value op may produce (the image-sized comparisons and copies of
# get_image_features: images x 3 x tile^2); torch's own limit is 1 (scalars).
HOST_VALUE_NUMEL_LIMIT = 1 << 30


def load_config(config_path: Path):
    """Idefics3Config from a config.json, with the KV cache off (training)."""
    from transformers import Idefics3Config

    config = without_cache(Idefics3Config(**json.loads(Path(config_path).read_text())), config_path)
    vocab = config.text_config.vocab_size
    if config.image_token_id >= vocab:
        # NB: SmolVLM-Instruct's config.json names image token 49190 beside a 49,155-row
        # embedding. Idefics3Model embeds the input ids before it puts the image features at
        # the image token's positions, so on a GPU that lookup is out of range (a device-side
        # assert in the gather); on fake tensors nothing checks it. Which id marks the image
        # positions allocates nothing: the embedding's last row stands for it.
        config.image_token_id = vocab - 1
    return config


def model_class():
    from transformers import Idefics3ForConditionalGeneration

    return Idefics3ForConditionalGeneration


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean."""
    return {
        "vision": [model.model.vision_model],
        "projector": [model.model.connector],
        "language": [model.model.text_model, model.lm_head],
    }


def checkpoint_module(model, name: str) -> torch.nn.Module:
    """The PreTrainedModel whose checkpointing covers the experiment module's layers."""
    return {"vision": model.model.vision_model, "language": model.model.text_model}[name]


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """The tower's bidirectional mask is skipped when every patch is real, as on a GPU.

    NB: masking_utils._ignore_bidirectional_mask_sdpa reads `padding_mask.all()` unless the
    mask is being traced (`is_tracing`), which a fake tensor always counts as; then sdpa would
    get a materialised [tiles, 1, patches, patches] mask and the memory-efficient kernel. The
    patch mask here derives from the batch's host values, so its constant answers `.all()`.
    """
    from torch._subclasses import fake_tensor
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers import masking_utils

    original = masking_utils._ignore_bidirectional_mask_sdpa
    saved_limit = fake_tensor.CONSTANT_NUMEL_LIMIT

    def ignore_mask(padding_mask, kv_length, local_attention_size=None):
        constant = getattr(padding_mask, "constant", None)
        if isinstance(padding_mask, fake_tensor.FakeTensor) and constant is not None:
            with _disable_current_modes():  # read on the host, outside the fake and tracing modes
                every = bool(constant.all())
            return every and (local_attention_size is None or kv_length < local_attention_size)
        return original(padding_mask, kv_length, local_attention_size)

    masking_utils._ignore_bidirectional_mask_sdpa = ignore_mask
    fake_tensor.CONSTANT_NUMEL_LIMIT = HOST_VALUE_NUMEL_LIMIT
    try:
        yield [BIDIRECTIONAL_MASK_SKIP]
    finally:
        masking_utils._ignore_bidirectional_mask_sdpa = original
        fake_tensor.CONSTANT_NUMEL_LIMIT = saved_limit


def _edge(config, key: str, default: int) -> int:
    value = config.preprocessor.get(key) or getattr(config.vision_config, key, None) or {}
    return int(value.get("longest_edge", default)) if isinstance(value, dict) else default


def tiles_per_image(config, image_size: list[int] | None) -> int:
    """Idefics3ImageProcessor's tiles for one image of [h, w] (square when None).

    Follows image_processing_idefics3.py: `_resize_output_size_rescale_to_max_len` (longest
    edge to size.longest_edge, the other scaled, truncated, made even), then
    `resize_for_vision_encoder` (each side up to a multiple of the tile) and `split_images`
    (rows x cols tiles plus the global one when it splits).
    """
    tile = _edge(config, "max_image_size", DEFAULT_TILE)
    if not config.preprocessor.get("do_image_splitting", True):
        return 1
    longest = _edge(config, "size", DEFAULT_LONGEST_EDGE)
    h, w = image_size or (1, 1)
    aspect = w / h
    if w >= h:
        w = longest
        h = int(w / aspect)
        h += h % 2
    else:
        h = longest
        w = int(h * aspect)
        w += w % 2
    h, w = max(h, 1), max(w, 1)
    aspect = w / h
    if w >= h:
        w = math.ceil(w / tile) * tile
        h = math.ceil(int(w / aspect) / tile) * tile
    else:
        h = math.ceil(h / tile) * tile
        w = math.ceil(int(h * aspect) / tile) * tile
    if h > tile or w > tile:
        return (h // tile) * (w // tile) + 1
    return 1


def image_seq_len(config) -> int:
    """Idefics3Model.image_seq_len: (image_size / patch)^2 / scale_factor^2 tokens per tile."""
    v = config.vision_config
    return (v.image_size // v.patch_size) ** 2 // config.scale_factor**2


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    b, images = exp["micro_batch"], exp["images_per_sample"]
    tiles = images * tiles_per_image(config, exp.get("image_size"))
    input_ids, labels = image_first_tokens(exp, tiles * image_seq_len(config), config.image_token_id, f" ({tiles} tiles)")
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        size = config.vision_config.image_size
        channels = config.vision_config.num_channels
        batch["pixel_values"] = torch.ones(b, tiles, channels, size, size, dtype=dtype)
        batch["pixel_attention_mask"] = torch.ones(b, tiles, size, size, dtype=torch.long)
    return batch
