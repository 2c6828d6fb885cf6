"""InternVL 2.5 / 3, transformers-native (InternVLForConditionalGeneration) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`), plus
`checkpoint_module(model, name)` and `host_patches()` (see `qwen2_vl.py`).

The batch is what InternVLProcessor produces for one image per sample at the experiment's
`image_size` (default: the spec's): GotOcr2ImageProcessor cuts each image into the tile grid
whose aspect ratio is closest to the image's (1 to max_patches tiles, larger grids of the same
ratio while the image covers over half of them) and adds a thumbnail when there is more than
one tile; `pixel_values` [b * images * tiles, C, 448, 448]; `input_ids` of exactly seq_len
positions with 256 image tokens per tile first in every sample; labels with the image tokens
at -100. Only the tile count reaches memory, so the search is reproduced, not the resizing.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import torch

from ...library.expr_python import FUNCTIONS
from ..experiment import ExperimentError
from . import image_first_tokens, preprocessor_config
from .llava import module_groups  # noqa: F401  (the same vision_tower / multi_modal_projector / language_model layout)

# GotOcr2ImageProcessor's InternVL settings (the -hf repos' preprocessor_config.json), used when
# none lies beside the config.
DEFAULT_MIN_PATCHES = 1
DEFAULT_MAX_PATCHES = 12
DYNAMIC_ROPE_ON_HOST = "dynamic-rope-update-on-host"


def load_config(config_path: Path):
    """InternVLConfig from a config.json, with the KV cache off (training)."""
    from transformers import InternVLConfig

    config = InternVLConfig(**json.loads(Path(config_path).read_text()))
    config.text_config.use_cache = False
    config.preprocessor = preprocessor_config(config_path)
    return config


def model_class():
    from transformers import InternVLForConditionalGeneration

    return InternVLForConditionalGeneration


def checkpoint_module(model, name: str) -> torch.nn.Module:
    """The PreTrainedModel whose checkpointing covers the experiment module's layers."""
    return {"vision": model.model.vision_tower, "language": model.model.language_model}[name]


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """InternVL3's language model has dynamic rotary scaling (rope_scaling dynamic, factor 2).

    NB: modeling_rope_utils.dynamic_rope_update reads `torch.max(position_ids) + 1` on the
    host (a data-dependent scalar fake tensors cannot give) and recomputes inv_freq only when
    the sequence outgrows max_position_embeddings. Here the decision is made from the shape
    (training positions are 0 .. s - 1): within the limit the rotary forward runs as is; what
    the real update allocates is that one-element max and its + 1 (512 B each, freed at once).
    """
    from transformers.models.qwen2 import modeling_qwen2

    cls = modeling_qwen2.Qwen2RotaryEmbedding
    saved = cls.forward
    rope_forward = torch.no_grad()(saved.__wrapped__.__wrapped__)  # no_grad(dynamic_rope_update(f)) -> f

    def forward(self, x, position_ids, *args, **kwargs):
        if "dynamic" in str(self.rope_type) and position_ids.shape[-1] > self.original_max_seq_len:
            raise ExperimentError(
                f"seq_len {position_ids.shape[-1]} outgrows max_position_embeddings {self.original_max_seq_len}: the dynamic rotary rescaling is not emulated"
            )
        return rope_forward(self, x, position_ids, *args, **kwargs)

    cls.forward = forward
    try:
        yield [DYNAMIC_ROPE_ON_HOST]
    finally:
        cls.forward = saved


def crop_tiles(preprocessor: dict, tower_size: int, image_size: list[int]) -> int:
    """Tiles GotOcr2ImageProcessor.crop_image_to_patches makes of one [h, w] image, the
    thumbnail included (use_thumbnail): the preprocessor's tile size (else the tower's) and
    min / max patches (else the processor's defaults)."""
    tile = preprocessor.get("size", {}).get("height", tower_size)
    return FUNCTIONS["crop_to_patches"](
        image_size[0], image_size[1], tile, preprocessor.get("min_patches", DEFAULT_MIN_PATCHES), preprocessor.get("max_patches", DEFAULT_MAX_PATCHES)
    )


def tiles_per_image(config, image_size: list[int]) -> int:
    """Tiles of one image, the thumbnail included."""
    return crop_tiles(config.preprocessor, config.vision_config.image_size[0], image_size)


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    b, images = exp["micro_batch"], exp["images_per_sample"]
    if not exp.get("image_size"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: InternVL needs image_size [h, w]")
    v = config.vision_config
    tiles = tiles_per_image(config, exp["image_size"])
    input_ids, labels = image_first_tokens(
        exp, images * tiles * config.image_seq_length, config.image_token_id, f" ({images} x {tiles} tiles x {config.image_seq_length})"
    )
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        h, w = v.image_size
        batch["pixel_values"] = torch.zeros(b * images * tiles, v.num_channels, h, w, dtype=dtype)
    return batch
