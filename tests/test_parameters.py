"""Parameter counts equal the published checkpoints', with the arithmetic shown."""

import pytest

from compiler.api import estimate

# CLIP ViT-L/14-336: patch conv 3*14*14*1024 = 602_112; class 1024; positions 577*1024 = 590_848;
# pre-LN 2048; a layer: attention 4*(1024*1024 + 1024) = 4_198_400, MLP 1024*4096 + 4096 +
# 4096*1024 + 1024 = 8_393_728, two LayerNorms 4096 -> 12_596_224; 24 layers; post-LN 2048.
VISION = 602_112 + 1024 + 590_848 + 2048 + 24 * 12_596_224 + 2048
# Llama layer: 4 * h^2 (attention) + 3 * h * f (SwiGLU) + 2 * h (two RMSNorms).
LAYER_7B = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
LAYER_13B = 4 * 5120**2 + 3 * 5120 * 13824 + 2 * 5120


def test_arithmetic_matches_the_published_numbers():
    assert VISION == 303_507_456
    assert 1024 * 4096 + 4096 + 4096 * 4096 + 4096 == 20_979_712
    assert 32064 * 4096 + 32 * LAYER_7B + 4096 == 6_607_605_760  # embeddings + layers + final norm
    assert 32064 * 4096 == 131_334_144  # lm_head, untied


@pytest.mark.parametrize(
    "spec,expected",
    [
        (
            "specs/llava/llava-1.5-7b.yaml",
            {"vision": VISION, "projector": 20_979_712, "language": 6_607_605_760 + 131_334_144},
        ),
        (
            "specs/llava/llava-1.5-13b.yaml",
            {
                "vision": VISION,
                "projector": 1024 * 5120 + 5120 + 5120 * 5120 + 5120,
                "language": 32064 * 5120 + 40 * LAYER_13B + 5120 + 32064 * 5120,
            },
        ),
    ],
)
def test_module_parameters(spec, expected):
    report = estimate(spec, micro_batch=1, seq_len=1024)
    assert dict(report.parameters) == expected


def test_totals():
    assert sum(estimate("specs/llava/llava-1.5-7b.yaml", micro_batch=1, seq_len=1024).parameters.values()) == 7_063_427_072
    assert sum(estimate("specs/llava/llava-1.5-13b.yaml", micro_batch=1, seq_len=1024).parameters.values()) == 13_351_494_656


def test_lm_head_row():
    rows = estimate("specs/llava/llava-1.5-7b.yaml", micro_batch=1, seq_len=1024).rows
    (head,) = [r for r in rows if r.path == "language.lm_head"]
    assert head.parameters == 131_334_144 * 2  # bf16 weights
