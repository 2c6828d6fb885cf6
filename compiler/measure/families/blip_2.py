"""BLIP-2 with an OPT language model (Blip2ForConditionalGeneration) for the measuring harness.

Contract: as in `llava.py`. The modules are the vision tower (vision_model), the Q-Former with
its learned queries (qformer, query_tokens), the projector (language_projection) and the
language model (language_model, OPTForCausalLM). The batch carries num_query_tokens image
tokens first in every sample, as Blip2Processor puts them, then text; no attention mask
(Blip2ForConditionalGeneration makes torch.ones_like(input_ids) itself); `host_patches()`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from . import NormalInit, fixed_size_batch, without_cache


# What host_patches applies, as the record's emulation lists it.
ONES_MASK_SKIP = "blip2-ones-masks-skipped-as-on-gpu"


class _Holder(torch.nn.Module):
    """A module whose one parameter is the model's query_tokens, so that a module group can
    set its requires_grad (query_tokens is a bare parameter of the top-level model)."""

    def __init__(self, parameter: torch.nn.Parameter):
        super().__init__()
        self.query_tokens = parameter


def load_config(config_path: Path):
    """Blip2Config from a config.json, with the KV cache off (training)."""
    from transformers import Blip2Config

    return without_cache(Blip2Config(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    # NB: Blip2VisionEmbeddings' init draws trunc_normal_ (see NormalInit)
    return NormalInit("Blip2ForConditionalGeneration")


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean."""
    return {
        "vision": [model.vision_model],
        "qformer": [model.qformer, _Holder(model.query_tokens)],
        "projector": [model.language_projection],
        "language": [model.language_model],
    }


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (num_query_tokens image tokens first in every sample) and labels."""
    return fixed_size_batch(config, exp, dtype, config.num_query_tokens)


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """BLIP-2's masks are all ones, so sdpa gets none, as on a GPU.

    NB: Blip2ForConditionalGeneration passes the language model attention_mask =
    torch.ones_like(input_ids), and the Q-Former an image_attention_mask of torch.ones; on a GPU
    masking_utils reads `padding_mask.all()` and skips both masks (sdpa's flash kernel, causal
    for OPT); a fake tensor counts as traced, which would materialise them and pick the
    memory-efficient kernel. Every mask BLIP-2 makes is all ones by construction, so a fake one
    is read as no padding at all."""
    from torch._subclasses.fake_tensor import FakeTensor
    from transformers import masking_utils

    causal, bidirectional = masking_utils._ignore_causal_mask_sdpa, masking_utils._ignore_bidirectional_mask_sdpa

    def ignore_causal(padding_mask, *args, **kwargs):
        return causal(None if isinstance(padding_mask, FakeTensor) else padding_mask, *args, **kwargs)

    def ignore_bidirectional(padding_mask, *args, **kwargs):
        return bidirectional(None if isinstance(padding_mask, FakeTensor) else padding_mask, *args, **kwargs)

    masking_utils._ignore_causal_mask_sdpa = ignore_causal
    masking_utils._ignore_bidirectional_mask_sdpa = ignore_bidirectional
    try:
        yield [ONES_MASK_SKIP]
    finally:
        masking_utils._ignore_causal_mask_sdpa, masking_utils._ignore_bidirectional_mask_sdpa = causal, bidirectional
