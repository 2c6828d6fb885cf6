"""Idefics2 (Idefics2ForConditionalGeneration) for the measuring harness.

Contract: as `qwen2_vl.py` (`load_config`, `model_class`, `module_groups`, `make_batch`,
`HOST_VALUES`, `checkpoint_module`, `host_patches`).

The batch is what Idefics2Processor produces without image splitting for `images_per_sample`
images per sample at the experiment's `image_size` (default: square at size.longest_edge, the most
patches): every image resized (get_resize_output_image_size: the longest edge down to
size.longest_edge, then each edge up to size.shortest_edge), `pixel_values` [b, images, 3, h, w]
in the compute dtype (no image all zero: an all-zero image is a padding image that
get_image_features drops), `pixel_attention_mask` [b, images, h, w] int64 ones (no padding: every
image of the batch has the same size), `input_ids` of exactly seq_len positions whose first
images x resampler_n_latents are the image token, labels with those at -100.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Iterator

import torch

from . import image_first_tokens, without_cache
from . import idefics3
from .idefics3 import HOST_VALUES, checkpoint_module, module_groups  # noqa: F401  (the same tower, masks and submodules)

# The resampler's mask is the patch mask with a column of ones per latent (torch.ones, which a fake
# tensor holds no value of); whether the patch mask is all true is known on the host.
RESAMPLER_MASK_SKIP = "resampler-mask-skip-reads-host-values"
_RESAMPLER = threading.local()

# Idefics2ImageProcessor's defaults (image_processing_idefics2.py), used when
# preprocessor_config.json does not say
DEFAULT_SIZE = {"shortest_edge": 378, "longest_edge": 980}


def load_config(config_path: Path):
    """Idefics2Config from a config.json, with the KV cache off (training)."""
    from transformers import Idefics2Config

    return without_cache(Idefics2Config(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    from transformers import Idefics2ForConditionalGeneration

    return Idefics2ForConditionalGeneration


def resized(config, image_size: list[int] | None) -> tuple[int, int]:
    """(h, w) of one image after Idefics2ImageProcessor.resize (get_resize_output_image_size, in
    its float arithmetic); square at the longest edge without a size."""
    size = {**DEFAULT_SIZE, **(config.preprocessor.get("size") or {})}
    longest, shortest = size["longest_edge"], size["shortest_edge"]
    height, width = image_size or (longest, longest)
    aspect_ratio = width / height
    if width >= height and width > longest:
        width = longest
        height = int(width / aspect_ratio)
    elif height > width and height > longest:
        height = longest
        width = int(height * aspect_ratio)
    return max(height, shortest), max(width, shortest)


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    if config.preprocessor.get("do_image_splitting", False):
        from ..experiment import ExperimentError

        raise ExperimentError(f"experiment {exp['experiment']!r}: do_image_splitting is not measured (the crops are padded under a patch mask)")
    b, images = exp["micro_batch"], exp["images_per_sample"]
    latents = config.perceiver_config.resampler_n_latents
    input_ids, labels = image_first_tokens(exp, images * latents, config.image_token_id, f" ({images} x {latents} latents)")
    batch = {"input_ids": input_ids, "labels": labels, "attention_mask": None}
    if images:
        h, w = resized(config, exp.get("image_size"))
        batch["pixel_values"] = torch.ones(b, images, config.vision_config.num_channels, h, w, dtype=dtype)
        batch["pixel_attention_mask"] = torch.ones(b, images, h, w, dtype=torch.long)
    return batch


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """Idefics3's host patches (the tower's bidirectional mask skipped when every patch is real,
    as on a GPU), and the same answer for the perceiver resampler's mask.

    NB: Idefics2PerceiverResampler.forward concatenates the patch mask with torch.ones for the
    latents and asks create_bidirectional_mask for the sdpa mask, whose
    `_ignore_bidirectional_mask_sdpa` reads `padding_mask.all()`: on a GPU, True when every patch
    is real (flash with grouped heads, no mask); on fake tensors the concatenation has no value,
    so it would materialise the mask (the memory-efficient kernel, k and v repeated). The patch
    mask's own value decides here, while the resampler runs.
    """
    from torch._subclasses import fake_tensor
    from torch.utils._python_dispatch import _disable_current_modes
    from transformers import masking_utils
    from transformers.models.idefics2 import modeling_idefics2

    resampler = modeling_idefics2.Idefics2PerceiverResampler
    original_forward = resampler.forward

    def forward(self, context, attention_mask, **kwargs):
        constant = getattr(attention_mask, "constant", None)
        if constant is not None:
            with _disable_current_modes():
                _RESAMPLER.all_real = bool(constant.all())
        try:
            return original_forward(self, context, attention_mask, **kwargs)
        finally:
            _RESAMPLER.all_real = None

    with idefics3.host_patches() as applied:
        inner = masking_utils._ignore_bidirectional_mask_sdpa

        def ignore_mask(padding_mask, kv_length, local_attention_size=None):
            all_real = getattr(_RESAMPLER, "all_real", None)
            if all_real is not None and isinstance(padding_mask, fake_tensor.FakeTensor) and getattr(padding_mask, "constant", None) is None:
                return all_real and (local_attention_size is None or kv_length < local_attention_size)
            return inner(padding_mask, kv_length, local_attention_size)

        masking_utils._ignore_bidirectional_mask_sdpa = ignore_mask
        resampler.forward = forward
        try:
            yield applied + [RESAMPLER_MASK_SKIP]
        finally:
            resampler.forward = original_forward
            masking_utils._ignore_bidirectional_mask_sdpa = inner
