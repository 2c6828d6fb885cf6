"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration) for the measuring harness: the batch,
module groups and host values are Qwen2-VL's (`qwen2_vl.py`); the classes differ, and the
vision tower's window index is computed on the host (`host_patches`)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import torch

from . import qwen2_vl, without_cache
from .qwen2_vl import (  # noqa: F401  (the family contract, re-exported)
    HOST_VALUES,
    checkpoint_module,
    image_grid,
    make_batch,
    module_groups,
)

WINDOW_INDEX_ON_HOST = "vision-window-index-on-host"


def load_config(config_path: Path):
    """Qwen2_5_VLConfig from a config.json, with the KV cache off (training)."""
    from transformers import Qwen2_5_VLConfig

    return without_cache(Qwen2_5_VLConfig(**json.loads(Path(config_path).read_text())), config_path)


def model_class():
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration


def host_window_index(original, missing: str):
    """`get_vision_window_index` run on a real host copy of the grid under the tracer, its two
    results handed back as fake tensors that carry their values (see host_patches); a
    fake grid without its values is an error naming `missing`."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _disable_current_modes

    def get_vision_window_index(grid_thw, spatial_merge_size, window_size, patch_size, kwargs=None):
        if not isinstance(grid_thw, FakeTensor):
            return original(grid_thw, spatial_merge_size, window_size, patch_size, kwargs=kwargs)
        fake_mode = grid_thw.fake_mode
        if grid_thw.constant is None:
            raise RuntimeError(f"{missing} without its values (HOST_VALUES)")
        grid = grid_thw.constant.tolist()  # the host copy a GPU run syncs for; no device op
        with _disable_current_modes():
            window_index, cu_window_seqlens = original(torch.tensor(grid, dtype=grid_thw.dtype), spatial_merge_size, window_size, patch_size, kwargs=kwargs)
        convert = fake_mode.fake_tensor_converter.from_real_tensor
        window_index = convert(fake_mode, window_index, make_constant=True)
        cu_window_seqlens = convert(fake_mode, cu_window_seqlens, make_constant=True).clone()
        return window_index, cu_window_seqlens

    return get_vision_window_index


@contextlib.contextmanager
def host_patches() -> Iterator[list[str]]:
    """Qwen2-VL's `get_rope_index` patch, plus `get_vision_window_index` run on the host.

    NB: transformers/vision_utils.py `get_vision_window_index` reads the image grid with
    `.tolist()` and selects the unpadded window positions with a boolean mask
    (`index_padded[index_padded != -100]`, aten.nonzero), whose output shape a fake tensor
    cannot know. The patch runs that same function, unchanged, on a real CPU copy of the grid
    with every dispatch mode off (so the tracer sees none of its temporaries) and hands back
    its two results as fake tensors that carry their values, so that the attention's
    `lengths.tolist()` split and the permutations work as on the GPU:
    - `window_index`: made by `torch.arange` without a device, so it lives on the host on a
      CUDA machine too: not counted (indexing a device tensor with it copies the n/4 int64
      indices to the device inside aten.index, at most a few KiB, not traced);
    - `cu_window_seqlens`: `torch.tensor(..., device=grid_thw.device)`, an int32 device
      tensor of windows + 1 values: counted, through a clone under the tracer (512 B).
    """
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

    original = modeling_qwen2_5_vl.get_vision_window_index
    get_vision_window_index = host_window_index(original, "image_grid_thw reached the vision tower")

    with qwen2_vl.host_patches() as patched:
        modeling_qwen2_5_vl.get_vision_window_index = get_vision_window_index
        try:
            yield patched + [WINDOW_INDEX_ON_HOST]
        finally:
            modeling_qwen2_5_vl.get_vision_window_index = original
