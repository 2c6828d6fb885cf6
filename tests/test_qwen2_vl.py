"""Qwen2-VL and Qwen2.5-VL: the import reproduces the checkpoints' parameter counts per module,
and the image size moves the estimate the way the processor moves the token count."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler import api
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
HUB = ROOT / "tests" / "fixtures" / "hub"


@pytest.mark.parametrize("fixture, expected", [
    ("Qwen2-VL-7B-Instruct", {
        # patch embedding 1280 * 3 * 2 * 14 * 14 = 1_505_280 + 32 blocks * 19_677_440
        "vision": 631_183_360,
        # LayerNorm 2 * 1280 + 5120 * 5120 + 5120 + 3584 * 5120 + 3584
        "projector": 44_575_744,
        # embeddings 152064 * 3584 = 544_997_376 + 28 * 233_057_792 + norm 3584 + lm_head 544_997_376
        "language": 7_615_616_512,
    }),
    ("Qwen2.5-VL-7B-Instruct", {
        "vision": 631_975_680,          # 1_505_280 + 32 * 19_702_200 (RMSNorms, SwiGLU with bias)
        "projector": 44_574_464,        # RMSNorm 1280 + the same MLP
        "language": 7_615_616_512,
    }),
])
def test_import_reproduces_the_header_per_module(fixture, expected):
    result = importer.import_spec(str(HUB / fixture))
    assert result.header_parameters == expected
    # 8_291_375_616 is Qwen2-VL-7B-Instruct's count built by transformers on the meta device
    assert sum(expected.values()) == {"Qwen2-VL-7B-Instruct": 8_291_375_616, "Qwen2.5-VL-7B-Instruct": 8_292_166_656}[fixture]


def test_qwen2_decoder_layer_arithmetic():
    # q 3584^2 + 3584, k and v 512 * 3584 + 512 each, o 3584^2, MLP 3 * 3584 * 18944, 2 norms
    layer = 3584 * 3584 + 3584 + 2 * (512 * 3584 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    assert layer == 233_057_792
    assert 2 * 152064 * 3584 + 28 * layer + 3584 == 7_615_616_512


@pytest.mark.parametrize("size, tokens", [((448, 448), 256), ((1024, 768), 37 * 27), ((434, 434), 16 * 16), ((462, 462), 16 * 16)])
def test_image_size_sets_the_image_tokens(size, tokens):
    """smart_resize: each side to the nearest multiple of 28, halves to even (434 = 15.5 x 28 -> 16, 462 = 16.5 x 28 -> 16)."""
    report = api.estimate(str(ROOT / "specs" / "qwen2_vl" / "qwen2-vl-7b-instruct.yaml"), micro_batch=1, seq_len=2048,
                          image_size=list(size))
    assert report.setup.image_size == size
    base = api.estimate(str(ROOT / "specs" / "qwen2_vl" / "qwen2-vl-7b-instruct.yaml"), micro_batch=1, seq_len=2048)
    assert (report.allocated > base.allocated) == (tokens > 256) or tokens == 256


@pytest.mark.parametrize("size, seen", [
    ((4000, 4000), (3584, 3584)),  # rounded 4004^2 > max_pixels 12_845_056: beta = sqrt(16e6 / 12_845_056), floor to 28s -> 128 x 128 = 16_384 tokens
    ((14, 14), (56, 56)),          # rounded 0 x 0 < min_pixels 3136: beta = sqrt(3136 / 196) = 4, ceil to 28s -> 2 x 2 = 4 tokens
    ((1024, 768), (1036, 756)),    # within the bounds: each side to the nearest multiple of 28
])
def test_the_processors_resize_bounds_the_image_tokens(size, seen):
    """Qwen2.5-VL's preprocessor_config.json: min_pixels 3136, max_pixels 12_845_056. Outside them
    smart_resize rescales the image; a 4000 x 4000 image was counted as 143 x 143 = 20_449 tokens."""
    report = api.estimate(str(ROOT / "specs" / "qwen2_vl" / "qwen2.5-vl-7b-instruct.yaml"), micro_batch=1, seq_len=32768,
                          image_size=list(size))
    assert report.setup.image_size == size and report.setup.image_hw == seen
    assert api.image_tokens_per_sample(report.nodes) == (seen[0] // 28) * (seen[1] // 28)


def test_text_only_batch_runs_no_vision_kernel():
    # images_per_sample 0: the tower's batch is 0 images, so its attention makes no kernel call
    # (calls 0) and saves nothing, even with the tower trainable (the refusal E206 'calls >= 1'
    # was the old answer); the estimate equals the one with the tower frozen.
    spec = str(ROOT / "specs" / "qwen2_vl" / "qwen2.5-vl-7b-instruct.yaml")
    common = dict(micro_batch=1, seq_len=1024, images_per_sample=0, attention="sdpa", precision="bf16")
    trained = api.estimate(spec, trainable=["vision", "projector", "language"], **common)
    vision = [r for r in trained.rows if r.path.startswith("vision.") and r.type == "attention_core"]
    assert vision and all(not r.activations for r in vision)
    assert sum(b for n in trained.nodes if n.inst.module == "vision" for x in n.walk() for _, b in x.cost.saved) == 0
