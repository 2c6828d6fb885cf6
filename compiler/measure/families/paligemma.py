"""PaliGemma and PaliGemma 2 (PaliGemmaForConditionalGeneration) for the measuring harness.

Contract: as in `llava.py`. The batch carries token_type_ids, as PaliGemma's processor makes
them for training: 0 over the image tokens (the prefix, attended bidirectionally), 1 over the
text that follows (the suffix, causal), whose positions alone carry labels.
NB: transformers 5.23 loads PaliGemma 2 (a Gemma 2 language model) with eager or
flash_attention_2 only; asking for sdpa raises in Gemma2Model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import image_first_tokens
from .llava import module_groups  # noqa: F401  (the same vision_tower / multi_modal_projector / language_model layout)



def load_config(config_path: Path):
    """PaliGemmaConfig from a config.json, with the KV cache off (training)."""
    from transformers import PaliGemmaConfig

    config = PaliGemmaConfig(**json.loads(Path(config_path).read_text()))
    config.text_config.use_cache = False
    return config


class _Builder:
    """PaliGemmaForConditionalGeneration whose random init runs on fake tensors.

    NB: SigLIP's `_init_weights` draws with `trunc_normal_` (lecun_normal_ via
    transformers.initialization), whose torch implementation reads a tensor value that fake
    tensors do not have (DataDependentOutputException); while the model is built it draws from
    a plain normal instead, in place, which allocates nothing either way.
    """

    @staticmethod
    def _from_config(config, **kwargs):
        from transformers import PaliGemmaForConditionalGeneration
        from transformers import initialization

        table = initialization.TORCH_INIT_FUNCTIONS
        original = table["trunc_normal_"]
        table["trunc_normal_"] = lambda tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None: tensor.normal_(mean, std, generator=generator)
        try:
            return PaliGemmaForConditionalGeneration._from_config(config, **kwargs)
        finally:
            table["trunc_normal_"] = original


def model_class():
    return _Builder


def image_tokens_per_image(config) -> int:
    """(image_size / patch)^2: 256 at 224 px, 1024 at 448, 4096 at 896 (so400m/14)."""
    return (config.vision_config.image_size // config.vision_config.patch_size) ** 2


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (image tokens first), token_type_ids and labels."""
    b, s, images = exp["micro_batch"], exp["seq_len"], exp["images_per_sample"]
    n_image = images * image_tokens_per_image(config)
    input_ids, labels = image_first_tokens(exp, n_image, config.image_token_id)
    size = config.vision_config.image_size
    token_type_ids = torch.ones((b, s), dtype=torch.long)
    token_type_ids[:, :n_image] = 0
    batch = {"input_ids": input_ids, "labels": labels, "token_type_ids": token_type_ids, "attention_mask": None}
    if images:
        batch["pixel_values"] = torch.zeros(b * images, config.vision_config.num_channels, size, size, dtype=dtype)
    return batch
