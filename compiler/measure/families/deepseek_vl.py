"""DeepSeek-VL (DeepseekVLForConditionalGeneration) for the measuring harness.

Contract: as in `llava.py`. The batch is what DeepseekVLProcessor makes for training:
`images_per_sample` images per sample, each padded and resized to the tower's image_size
(384 px), `pixel_values` [b x images, 3, size, size] in the compute dtype, `input_ids` of
exactly seq_len positions whose first images x (size / patch)^2 are the image token (576 per
image), labels with those at -100.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import image_first_tokens, without_cache


def load_config(config_path: Path):
    """DeepseekVLConfig from a config.json, with the KV cache off (training)."""
    from transformers import DeepseekVLConfig

    return without_cache(DeepseekVLConfig(**json.loads(Path(config_path).read_text())), config_path)


class _Builder:
    """DeepseekVLForConditionalGeneration whose random init runs on fake tensors.

    NB: SigLIP's `_init_weights` draws with `trunc_normal_`, which fake tensors cannot run
    (see paligemma.py); while the model is built it draws from a plain normal instead.
    """

    @staticmethod
    def _from_config(config, **kwargs):
        from transformers import DeepseekVLForConditionalGeneration
        from transformers import initialization

        table = initialization.TORCH_INIT_FUNCTIONS
        original = table["trunc_normal_"]
        table["trunc_normal_"] = lambda tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None: tensor.normal_(mean, std, generator=generator)
        try:
            return DeepseekVLForConditionalGeneration._from_config(config, **kwargs)
        finally:
            table["trunc_normal_"] = original


def model_class():
    return _Builder


def image_tokens_per_image(config) -> int:
    """(image_size / patch)^2: 576 for SigLIP-L/16 at 384 px."""
    return (config.vision_config.image_size // config.vision_config.patch_size) ** 2


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean."""
    return {
        "vision": [model.model.vision_model],
        "projector": [model.model.aligner],
        "language": [model.model.language_model, model.lm_head],
    }


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (image tokens first in every sample) and labels."""
    b, images = exp["micro_batch"], exp["images_per_sample"]
    input_ids, labels = image_first_tokens(exp, images * image_tokens_per_image(config), config.image_token_id)
    size = config.vision_config.image_size
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        batch["pixel_values"] = torch.zeros(b * images, config.vision_config.num_channels, size, size, dtype=dtype)
    return batch
