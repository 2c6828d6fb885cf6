"""LLaVA-NeXT-Video (LlavaNextVideoForConditionalGeneration: LLaVA-NeXT plus pooled video
frames) for the measuring harness.

Contract: as `llava_next.py`. Images are LLaVA-NeXT's batch; a video (one per sample) of
`video_frames` frames is what LlavaNextVideoProcessor makes of it: `pixel_values_videos`
[b, frames, C, 336, 336] and, after each sample's image tokens, frames x 144 video tokens
(num_image_tokens // 4 per frame, `replace_video_token`), labels -100 on both.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..experiment import ExperimentError
from . import image_first_tokens
from .llava_next import anyres, checkpoint_module, module_groups  # noqa: F401  (LLaVA-NeXT's layout)

HOST_VALUES = ("image_sizes",)


def load_config(config_path: Path):
    """LlavaNextVideoConfig from a config.json, with the KV cache off (training)."""
    from transformers import LlavaNextVideoConfig

    config = LlavaNextVideoConfig(**json.loads(Path(config_path).read_text()))
    config.text_config.use_cache = False
    return config


def model_class():
    from transformers import LlavaNextVideoForConditionalGeneration

    return LlavaNextVideoForConditionalGeneration


def frame_tokens(config) -> int:
    """LLM positions per video frame: LlavaNextVideoProcessor.replace_video_token's
    num_image_tokens // 4 ((336 / 14)^2 // 4 = 144, the 2 x 2 pooling)."""
    v = config.vision_config
    return (v.image_size // v.patch_size) ** 2 // 4


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    b, images = exp["micro_batch"], exp["images_per_sample"]
    videos, frames = exp.get("videos_per_sample") or 0, exp.get("video_frames") or 0
    if images not in (0, 1) or videos not in (0, 1):
        raise ExperimentError(f"experiment {exp['experiment']!r}: LLaVA-NeXT-Video is measured with one image or video per sample")
    if images and not exp.get("image_size"):
        raise ExperimentError(f"experiment {exp['experiment']!r}: LLaVA-NeXT-Video needs image_size [h, w] for its images")
    crops, n_image = anyres(config, exp["image_size"]) if images else (0, 0)
    n_video = videos * frames * frame_tokens(config)
    input_ids, labels = image_first_tokens(exp, n_image + n_video, config.image_token_id, " and video tokens")
    input_ids[:, n_image : n_image + n_video] = config.video_token_id
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if videos:
        v = config.vision_config
        batch["pixel_values_videos"] = torch.zeros(b, frames, v.num_channels, v.image_size, v.image_size, dtype=dtype)
    if images:
        v = config.vision_config
        batch["pixel_values"] = torch.zeros(b, crops, v.num_channels, v.image_size, v.image_size, dtype=dtype)
        batch["image_sizes"] = torch.tensor([list(exp["image_size"])] * b, dtype=torch.long)
    return batch
