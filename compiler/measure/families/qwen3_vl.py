"""Qwen3-VL (Qwen3VLForConditionalGeneration) for the measuring harness.

The batch, host values and checkpointing are Qwen2-VL's (`qwen2_vl.py`): pixel_values
[patches, C * 2 * 16 * 16], image_grid_thw (1, h / 16, w / 16) after the processor's
smart_resize with factor 32 (its bounds from preprocessor_config.json's size.shortest_edge and
size.longest_edge), the image tokens first in every sample. The vision tower's groups add the
learned position table (`pos_embed`) and the DeepStack mergers (`deepstack_merger_list`, part
of the projector with the final merger).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import torch

from . import qwen2_vl, without_cache
from .qwen2_vl import HOST_VALUES, ROPE_INDEX_SHAPES_ONLY, checkpoint_module  # noqa: F401  (the family contract)


def load_config(config_path: Path):
    """Qwen3VLConfig from a config.json, with the KV cache off (training); the processor's
    resize bounds (size.shortest_edge / longest_edge) as min_pixels / max_pixels."""
    from transformers import Qwen3VLConfig

    config = without_cache(Qwen3VLConfig(**json.loads(Path(config_path).read_text())), config_path)
    size = config.preprocessor.get("size") or {}
    for key, name in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if key not in config.preprocessor and name in size:
            config.preprocessor[key] = size[name]
    return config


def model_class():
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration


def module_groups(model) -> dict[str, list[torch.nn.Module]]:
    """Experiment module names -> the Hugging Face submodules they mean: the tower is the patch
    embedding, the learned position table and the blocks; the projector the final merger and the
    DeepStack mergers."""
    visual = model.model.visual
    return {
        "vision": [visual.patch_embed, visual.pos_embed, visual.blocks],
        "projector": [visual.merger, visual.deepstack_merger_list],
        "language": [model.model.language_model, model.lm_head],
    }


DEEPSTACK_NONZERO = "deepstack-mask-nonzero-shapes-only"


class _DeepstackAdd(torch.autograd.Function):
    """`_deepstack_process` (clone, `hidden[mask, :] + visual`, `hidden[mask, :] = ...`) with the
    boolean mask's nonzero positions made by shape.

    NB: aten.index and aten.index_put_ with a boolean mask [b, s] each expand it into its nonzero
    positions [n, 2] int64 inside the kernel (ATen's expandTensors), a temporary whose row count
    fake tensors cannot know; autograd saves the mask itself (already alive as visual_pos_masks).
    Here each op's [n, 2] positions are allocated by shape (n, the visual tokens, is the features'
    row count) and freed with the op, and only the mask is saved. The backward makes what
    IndexPutBackward0 and IndexBackward0 make: the gradient at the image positions [n, hidden]
    (the features' gradient), the gradient with those positions zeroed and the zeros with the
    gathered gradient put back, both [b, s, hidden], summed into the clone's gradient.
    """

    @staticmethod
    def forward(ctx, hidden_states, visual_embeds, visual_pos_masks):
        n = visual_embeds.shape[0]
        hidden_states = hidden_states.clone()
        rows = torch.empty(n, 2, dtype=torch.long, device=hidden_states.device)
        local_this = hidden_states[rows[:, 0], rows[:, 1], :] + visual_embeds
        del rows
        put = torch.empty(n, 2, dtype=torch.long, device=hidden_states.device)
        hidden_states[put[:, 0], put[:, 1], :] = local_this
        del put, local_this
        ctx.save_for_backward(visual_pos_masks)
        ctx.rows = n
        return hidden_states

    @staticmethod
    def backward(ctx, grad):
        (visual_pos_masks,) = ctx.saved_tensors
        n = ctx.rows
        rows = torch.empty(n, 2, dtype=torch.long, device=grad.device)
        grad_values = grad[rows[:, 0], rows[:, 1], :]
        zeroed = grad.index_put((rows[:, 0], rows[:, 1]), grad.new_zeros(()).expand(n, grad.shape[-1]))
        del rows
        rows = torch.empty(n, 2, dtype=torch.long, device=grad.device)
        gathered = grad.new_zeros(grad.shape).index_put_((rows[:, 0], rows[:, 1]), grad_values, accumulate=True)
        del rows
        return zeroed + gathered, grad_values, None


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """`Qwen3VLModel.get_rope_index` returns position_ids [3, b, s] and rope_deltas [b, 1] of the
    real shapes and dtypes without reading values (as Qwen2-VL's, `qwen2_vl.host_patches`), and
    `Qwen3VLTextModel._deepstack_process` indexes with the visual mask's nonzero positions made
    by shape (`_DeepstackAdd`)."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl

    text = modeling_qwen3_vl.Qwen3VLTextModel
    saved_deepstack = text._deepstack_process

    def _deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
        visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
        return _DeepstackAdd.apply(hidden_states, visual_embeds, visual_pos_masks.to(hidden_states.device))

    text._deepstack_process = _deepstack_process
    try:
        with qwen2_vl.rope_index_by_shape(modeling_qwen3_vl.Qwen3VLModel):
            yield [ROPE_INDEX_SHAPES_ONLY, DEEPSTACK_NONZERO]
    finally:
        text._deepstack_process = saved_deepstack


image_grid = qwen2_vl.image_grid


def make_batch(config, exp: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Qwen2-VL's batch (`qwen2_vl.make_batch`), with each temporal patch of a video its own run
    of video tokens between `<|vision_start|>` and `<|vision_end|>`, as Qwen3VLProcessor writes a
    video (a timestamp and the two marks per frame): Qwen3-VL's get_rope_index splits each
    video_grid_thw row into one row per temporal patch and reads one run of video tokens per row,
    so a video as one run gets position ids for its first temporal patch only (1,460 of 2,048
    tokens for 4 patches of 196: a CUDA step fails there; the trace's shape-only rope index does
    not read the runs). The marks are text positions (labels ignored), taken from the text after
    the video: every tensor keeps its shape."""
    from ..experiment import ExperimentError
    from . import IGNORE_INDEX

    batch = qwen2_vl.make_batch(config, exp, dtype)
    grid = batch.get("video_grid_thw")
    if grid is None:
        return batch
    grid_t, gh, gw = (int(x) for x in grid[0])
    per_patch = gh * gw // config.vision_config.spatial_merge_size**2
    runs = (exp.get("videos_per_sample") or 0) * grid_t
    types = batch["mm_token_type_ids"]
    first = int((types[0] == qwen2_vl.VIDEO_TOKEN_TYPE).nonzero()[0])
    end = first + runs * (per_patch + 2)
    if end > types.shape[1]:
        raise ExperimentError(
            f"experiment {exp['experiment']!r}: seq_len {types.shape[1]} is shorter than the image tokens, "
            f"{runs} x {per_patch} video tokens and a vision_start / vision_end pair around each run ({end})"
        )
    run = [config.vision_start_token_id] + [config.video_token_id] * per_patch + [config.vision_end_token_id]
    ids = torch.tensor(run * runs, dtype=torch.long)
    batch["input_ids"][:, first:end] = ids
    batch["labels"][:, first:end] = IGNORE_INDEX
    types[:, first:end] = torch.where(ids == config.video_token_id, qwen2_vl.VIDEO_TOKEN_TYPE, 0)
    return batch
