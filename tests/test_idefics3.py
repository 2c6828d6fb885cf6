"""Idefics3 / SmolVLM: the tile count the formulas derive from an image size against the
measuring builder's (which follows Idefics3ImageProcessor's float arithmetic), and the host
patch that lets the vision tower's all-true patch mask be skipped under fake tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler import api
from compiler.inputs import importer
from compiler.pipeline.resolve import resolve_setup

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub"


@pytest.mark.parametrize("fixture, side", [("SmolVLM-Instruct", 384), ("Idefics3-8B-Llama3", 364)])
@pytest.mark.parametrize("size", [
    [1, 1], [300, 2000], [2000, 300], [768, 1024], [769, 1024], [1000, 700], [1536, 641], [1080, 1920],
])
def test_formula_tiles_equal_the_processor_arithmetic(fixture, side, size):
    from compiler.measure.families import idefics3

    config = idefics3.load_config(FIX / fixture / "config.json")
    tiles = idefics3.tiles_per_image(config, size)
    spec = importer.import_spec(str(FIX / fixture)).spec
    per_tile = idefics3.image_seq_len(config)
    setup = resolve_setup(None, spec, {"micro_batch": 1, "seq_len": 17 * per_tile, "image_size": size})
    report = api.run(spec, setup)
    vision = next(row for row in report.rows if row.path == "vision")
    assert vision.buffers == tiles * side * side * (3 * 2 + 8)   # pixel_values bf16 + pixel_attention_mask int64
    assert api.image_tokens_per_sample(report.nodes) == tiles * per_tile


def test_all_true_patch_mask_is_skipped_as_on_a_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import masking_utils

    from compiler.measure.families import idefics3

    mode = FakeTensorMode()
    converter = mode.fake_tensor_converter
    every = converter.from_real_tensor(mode, torch.ones(2, 729, dtype=torch.bool), make_constant=True)
    some = torch.ones(2, 729, dtype=torch.bool)
    some[1, 5] = False
    padded = converter.from_real_tensor(mode, some, make_constant=True)
    assert masking_utils._ignore_bidirectional_mask_sdpa(every, 729) is False   # fake: counted as tracing
    with idefics3.host_patches() as names:
        assert names == [idefics3.BIDIRECTIONAL_MASK_SKIP]
        with mode:
            assert masking_utils._ignore_bidirectional_mask_sdpa(every, 729) is True
            assert masking_utils._ignore_bidirectional_mask_sdpa(padded, 729) is False
    assert masking_utils._ignore_bidirectional_mask_sdpa(every, 729) is False   # restored
