"""Per-family model builders for the measuring harness, one module per config `model_type`.

`family_for(config_path)` returns the module for a config.json's `model_type`; see
`llava.py` for the contract every module follows.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

from ..experiment import ExperimentError

TEXT_TOKEN_ID = 1  # the text positions' token id: any id other than the image token will do
IGNORE_INDEX = -100  # transformers ForCausalLMLoss ignore_index


def family_for(config_path: Path) -> ModuleType:
    """The builder module named after the config's model_type, or `<model_type>_<vision type>`
    where one exists for its vision_config.model_type (llava_pixtral); a LLaVA conversion marked
    is_yi_vl_derived_model has Yi-VL's (yi_vl: its projector has LayerNorms)."""
    config = json.loads(Path(config_path).read_text())
    if config.get("is_yi_vl_derived_model") is True:
        return importlib.import_module(f"{__name__}.yi_vl")
    # NB: a module name cannot hold a hyphen (BLIP-2's model_type is "blip-2")
    model_type = config.get("model_type", "").replace("-", "_")
    vision_type = (config.get("vision_config") or {}).get("model_type")
    if vision_type and (Path(__file__).parent / f"{model_type}_{vision_type}.py").exists():
        return importlib.import_module(f"{__name__}.{model_type}_{vision_type}")
    try:
        return importlib.import_module(f"{__name__}.{model_type}")
    except ModuleNotFoundError:
        known = sorted(p.stem for p in Path(__file__).parent.glob("*.py") if not p.stem.startswith("_"))
        raise ExperimentError(f"{config_path}: no measuring builder for model_type {model_type!r} (known: {', '.join(known)})") from None


def preprocessor_config(config_path: Path) -> dict:
    """The preprocessor_config.json beside a config.json (image sizes, tiling), {} without one."""
    path = Path(config_path).parent / "preprocessor_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def without_cache(config, config_path: Path):
    """A vision-language config for training: the KV cache off (top level and text model) and
    the processor's settings attached as `config.preprocessor`."""
    config.use_cache = False
    config.text_config.use_cache = False
    config.preprocessor = preprocessor_config(config_path)
    return config


class NormalInit:
    """transformers' `name` class, built with a random init that runs on fake tensors.

    NB: SigLIP's `_init_weights` draws with `trunc_normal_` (lecun_normal_ via
    transformers.initialization), whose torch implementation reads a tensor value that fake
    tensors do not have (DataDependentOutputException); while the model is built it draws from
    a plain normal instead, in place, which allocates nothing either way."""

    def __init__(self, name: str):
        self.__name__ = name

    def _from_config(self, config, **kwargs):
        import transformers
        from transformers import initialization

        table = initialization.TORCH_INIT_FUNCTIONS
        original = table["trunc_normal_"]
        table["trunc_normal_"] = lambda tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None: tensor.normal_(mean, std, generator=generator)
        try:
            return getattr(transformers, self.__name__)._from_config(config, **kwargs)
        finally:
            table["trunc_normal_"] = original


def image_first_tokens(exp: dict, n_image: int, image_token_id: int, detail: str = ""):
    """input_ids [b, s] with the sample's n_image image tokens first and text after, and labels
    that ignore the image positions; a sequence too short for the images is an ExperimentError
    (`detail` says how n_image was counted)."""
    import torch

    b, s = exp["micro_batch"], exp["seq_len"]
    if n_image > s:
        raise ExperimentError(f"experiment {exp['experiment']!r}: seq_len {s} is shorter than the {n_image} image tokens per sample{detail}")
    input_ids = torch.full((b, s), TEXT_TOKEN_ID, dtype=torch.long)
    input_ids[:, :n_image] = image_token_id
    labels = input_ids.clone()
    labels[:, :n_image] = IGNORE_INDEX
    return input_ids, labels


def fixed_size_batch(config, exp: dict, dtype, per_image: int, token_type_ids: bool = False) -> dict:
    """The batch of a tower that reads every image at its one size: pixel_values [b * images, C,
    size, size], input_ids with each sample's images x `per_image` image tokens first, labels,
    and with `token_type_ids` 1 over the image tokens (PaliGemma's and Gemma 3's prefix)."""
    import torch

    b, s, images = exp["micro_batch"], exp["seq_len"], exp["images_per_sample"]
    n_image = images * per_image
    input_ids, labels = image_first_tokens(exp, n_image, config.image_token_id)
    batch = {"input_ids": input_ids, "labels": labels}
    if token_type_ids:
        batch["token_type_ids"] = torch.zeros((b, s), dtype=torch.long)
        batch["token_type_ids"][:, :n_image] = 1
    batch["attention_mask"] = None
    if images:
        size = config.vision_config.image_size
        batch["pixel_values"] = torch.zeros(b * images, config.vision_config.num_channels, size, size, dtype=dtype)
    return batch
