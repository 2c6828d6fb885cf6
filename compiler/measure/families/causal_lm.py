"""Text-only causal language models (…ForCausalLM) for the measuring harness.

Contract: as in `llava.py`, with `config_class()` and `model_class()` named by the per-type
module that re-exports this one (`mistral.py`, `qwen2.py`, ...): `load_config(path)` reads
config.json into the family's config class with the KV cache off; `module_groups(model)`
maps "language" to the whole model (embeddings, decoder, head); `make_batch` returns
input_ids and labels of exactly seq_len positions and no attention mask; a packed experiment
gets one row of micro_batch x seq_len tokens with restarting position_ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..experiment import ExperimentError

# Token id of every position; any id inside the vocabulary will do.
TEXT_TOKEN_ID = 1


def load_config(config_path: Path):
    """AutoConfig.for_model(model_type, **config.json), with the KV cache off (training)."""
    from transformers import AutoConfig

    raw = json.loads(Path(config_path).read_text())
    config = AutoConfig.for_model(**raw)
    # Trainer-style training: no KV cache (a cache only adds references to k and v).
    config.use_cache = False
    return config


def model_class_for(model_type: str):
    """The …ForCausalLM class transformers registers for `model_type`."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.for_model(model_type))]


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> submodules: a text-only model is one module, "language"."""
    return {"language": [model]}


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """input_ids and labels [b, s] of one token id; attention_mask None (no padding)."""
    if exp["images_per_sample"]:
        raise ExperimentError(f"experiment {exp['experiment']!r}: a text-only model takes images_per_sample 0, got {exp['images_per_sample']}")
    if exp.get("packing"):
        # DataCollatorWithFlattening: the samples concatenated into one row, position_ids
        # restarting at every sample, no attention mask
        tokens = exp["micro_batch"] * exp["seq_len"]
        input_ids = torch.full((1, tokens), TEXT_TOKEN_ID, dtype=torch.long)
        position_ids = torch.arange(exp["seq_len"], dtype=torch.long).repeat(exp["micro_batch"]).unsqueeze(0)
        return {"input_ids": input_ids, "labels": input_ids.clone(), "position_ids": position_ids}
    input_ids = torch.full((exp["micro_batch"], exp["seq_len"]), TEXT_TOKEN_ID, dtype=torch.long)
    return {"input_ids": input_ids, "labels": input_ids.clone(), "attention_mask": None}
