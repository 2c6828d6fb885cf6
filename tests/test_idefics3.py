"""Idefics3 / SmolVLM: the tile count the formulas derive from an image size against the
measuring builder's (which follows Idefics3ImageProcessor's float arithmetic), and the host
patch that lets the vision tower's all-true patch mask be skipped under fake tensors."""

from __future__ import annotations

import json
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
@pytest.mark.parametrize(
    "size",
    [
        [1, 1],
        [300, 2000],
        [2000, 300],
        [768, 1024],
        [769, 1024],
        [1000, 700],
        [1536, 641],
        [1080, 1920],
    ],
)
def test_formula_tiles_equal_the_processor_arithmetic(fixture, side, size):
    from compiler.measure.families import idefics3

    config = idefics3.load_config(FIX / fixture / "config.json")
    tiles = idefics3.tiles_per_image(config, size)
    spec = importer.import_spec(str(FIX / fixture)).spec
    per_tile = idefics3.image_seq_len(config)
    setup = resolve_setup(None, spec, {"micro_batch": 1, "seq_len": 17 * per_tile, "image_size": size})
    report = api.run(spec, setup)
    vision = next(row for row in report.rows if row.path == "vision")
    assert vision.buffers == tiles * side * side * (3 * 2 + 8)  # pixel_values bf16 + pixel_attention_mask int64
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
    assert masking_utils._ignore_bidirectional_mask_sdpa(every, 729) is False  # fake: counted as tracing
    with idefics3.host_patches() as names:
        assert names == [idefics3.BIDIRECTIONAL_MASK_SKIP]
        with mode:
            assert masking_utils._ignore_bidirectional_mask_sdpa(every, 729) is True
            assert masking_utils._ignore_bidirectional_mask_sdpa(padded, 729) is False
    assert masking_utils._ignore_bidirectional_mask_sdpa(every, 729) is False  # restored


def test_the_measured_image_token_is_inside_the_embedding():
    """SmolVLM-Instruct's config.json names image token 49190 beside a 49,155-row embedding,
    which a GPU's embedding lookup refuses (the four SmolVLM steps of gpu-idefics3.yaml died of
    it on the H100): the measuring model marks the image positions with the last row instead.
    Idefics3-8B's token (128257 of 128259 rows) is its own."""
    from compiler.measure.families import idefics3

    smol = idefics3.load_config(FIX / "SmolVLM-Instruct" / "config.json")
    assert (smol.image_token_id, smol.text_config.vocab_size) == (49_154, 49_155)
    big = idefics3.load_config(FIX / "Idefics3-8B-Llama3" / "config.json")
    assert big.image_token_id == json.loads((FIX / "Idefics3-8B-Llama3" / "config.json").read_text())["image_token_id"]
    assert big.image_token_id < big.text_config.vocab_size
