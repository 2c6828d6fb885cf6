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
    model_type = json.loads(Path(config_path).read_text()).get("model_type", "")
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


def image_first_tokens(exp: dict, n_image: int, image_token_id: int, detail: str = ""):
    """input_ids [b, s] with the sample's n_image image tokens first and text after, and labels
    that ignore the image positions; a sequence too short for the images is an ExperimentError
    (`detail` says how n_image was counted)."""
    import torch

    b, s = exp["micro_batch"], exp["seq_len"]
    if n_image > s:
        raise ExperimentError(f"experiment {exp['experiment']!r}: seq_len {s} is shorter than the "
                              f"{n_image} image tokens per sample{detail}")
    input_ids = torch.full((b, s), TEXT_TOKEN_ID, dtype=torch.long)
    input_ids[:, :n_image] = image_token_id
    labels = input_ids.clone()
    labels[:, :n_image] = IGNORE_INDEX
    return input_ids, labels
