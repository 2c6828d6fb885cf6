"""Yi-VL in its transformers form (BUAADreamer/Yi-VL-6B-hf, -34B-hf: a LlavaConfig marked
is_yi_vl_derived_model) for the measuring harness.

Contract: as `llava.py` (`load_config`, `model_class`, `module_groups`, `make_batch`).

transformers builds the conversion as LlavaForConditionalGeneration, whose projector has two
Linears only; LLaMA-Factory swaps in a projector of four modules, linear_1 (Linear), linear_2
(LayerNorm), GELU, linear_3 (Linear), linear_4 (LayerNorm), Yi's mlp2x_gelu_Norm. `model_class`
builds the LLaVA model and puts that projector in place of the two-Linear one, in the built
model's dtype and on its device (meta or fake alike); the checkpoint's names and shapes are the
swapped projector's.
"""

from __future__ import annotations

import torch

from .llava import image_tokens_per_image, load_config, module_groups

__all__ = ["image_tokens_per_image", "load_config", "make_batch", "model_class", "module_groups"]


class YiVLProjector(torch.nn.Module):
    """Linear, LayerNorm, GELU, Linear, LayerNorm with the -hf checkpoint's module names."""

    def __init__(self, d_in: int, hidden: int, act: str, **factory):
        super().__init__()
        from transformers.activations import ACT2FN

        self.linear_1 = torch.nn.Linear(d_in, hidden, **factory)
        self.linear_2 = torch.nn.LayerNorm(hidden, **factory)
        self.act = ACT2FN[act]
        self.linear_3 = torch.nn.Linear(hidden, hidden, **factory)
        self.linear_4 = torch.nn.LayerNorm(hidden, **factory)

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        return self.linear_4(self.linear_3(self.act(self.linear_2(self.linear_1(image_features)))))


class _YiVLBuilder:
    """LlavaForConditionalGeneration's `_from_config`, the projector swapped."""

    __name__ = "LlavaForConditionalGeneration (Yi-VL projector)"

    @staticmethod
    def _from_config(config, **kwargs):
        from transformers import LlavaForConditionalGeneration

        model = LlavaForConditionalGeneration._from_config(config, **kwargs)
        old = model.model.multi_modal_projector.linear_1.weight
        # NB: built in place, in the dtype and on the device of the projector it replaces: a
        # module's .to() cannot swap fake parameters
        model.model.multi_modal_projector = YiVLProjector(
            config.vision_config.hidden_size, config.text_config.hidden_size, config.projector_hidden_act, dtype=old.dtype, device=old.device
        )
        return model


def model_class():
    return _YiVLBuilder


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pixel_values, input_ids (image tokens first in every sample) and labels, as LLaVA's."""
    from .llava import make_batch as llava_batch

    return llava_batch(config, exp, dtype)
