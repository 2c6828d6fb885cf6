"""LLaVA-OneVision: anyres tiling over 36 grid pinpoints and the anyres_max_9 downscale of the
tiles' features, worked by hand and checked against transformers' own counts where
transformers is installed."""

import math
import re
from pathlib import Path

import pytest

from compiler import api
from compiler.library.expr_python import FUNCTIONS

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "llava_onevision" / "llava-onevision-qwen2-0.5b-ov.yaml"
SPEC_7B = ROOT / "specs" / "llava_onevision" / "llava-onevision-qwen2-7b-ov.yaml"


def _dims(report, path: str) -> dict[str, int]:
    row = next(r for r in report.rows if r.path == path)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", row.dims)}


@pytest.mark.parametrize(
    "h, w, crops, tokens",
    [
        # 384 x 384 fits every pinpoint whole; (384, 384), 1 x 1, wastes least: 27 x 28 + 729 base
        (384, 384, 2, 1485),
        # 2 x 2 tiles: 54 x 54 features, 2916 < 1.21 x 9 x 729 = 7938.81, kept: 54 x 55 + 729
        (768, 768, 5, 3699),
        # 1152 x 1920 pinpoint (3 x 5 tiles): 81 x 135, the image wider (1920 / 1080 > 135 / 81):
        # 1080 * 135 // 1920 = 75 rows, padding 3 each side -> 75 x 135 = 10_125 > 7938.81: ratio
        # sqrt(10_125 / 6561) = 1.2423, int(75 // 1.2423) = 60, int(135 // 1.2423) = 108: 60 x 109 + 729
        (1080, 1920, 16, 7269),
        # 6 x 6 tiles: 162 x 162, ratio 2: 81 x 82 + 729
        (2304, 2304, 37, 7371),
    ],
)
def test_crops_and_image_positions(h, w, crops, tokens):
    report = api.estimate(str(SPEC), micro_batch=2, seq_len=8192, image_size=[h, w])
    assert _dims(report, "vision.patch_embedding")["b"] == 2 * crops  # the base image and its tiles
    assert _dims(report, "projector.projector.linear_1")["b"] == 2 * crops
    assert _dims(report, "language.image_merge[0]")["image_tokens"] == tokens


def test_floordiv_sqrt_is_the_processors_float_arithmetic():
    # 90 x 90 unpadded features: sqrt(8100 / 6561) = 10 / 9 exactly, but in doubles
    # 90 // 1.1111111111111112 is 80.0 where the integer square root says 81
    assert FUNCTIONS["floordiv_sqrt"](90, 90 * 90, 9 * 27 * 27) == 80
    assert math.isqrt(6561 * 90 // 90) == 81
    assert FUNCTIONS["floordiv_sqrt"](108, 108 * 108, 9 * 27 * 27) == 81


def test_against_transformers_processor_and_model_counts():
    pytest.importorskip("torch", reason="the builder's count runs transformers' functions")
    pytest.importorskip("transformers")
    from transformers.models.llava_onevision.modeling_llava_onevision import get_anyres_image_grid_shape

    from compiler.measure.families import llava_onevision

    config = llava_onevision.load_config(SPEC.parent / "hf" / "llava-onevision-qwen2-0.5b-ov" / "config.json")
    sizes = [(h, w) for h in (200, 384, 500, 768, 1000, 1080, 1500, 2304, 3000) for w in (224, 384, 640, 1000, 1344, 1920, 2800)]
    for h, w in sizes[::3]:
        crops, tokens = llava_onevision.anyres(config, [h, w])
        rows, cols = get_anyres_image_grid_shape([h, w], config.image_grid_pinpoints, 384)
        assert crops == 1 + rows * cols
        report = api.estimate(str(SPEC), micro_batch=1, seq_len=16384, image_size=[h, w])
        assert _dims(report, "vision.patch_embedding")["b"] == crops, (h, w)
        assert _dims(report, "language.image_merge[0]")["image_tokens"] == tokens, (h, w)


def test_import_reproduces_the_checked_in_specs():
    from compiler.inputs import importer

    for fixture, spec in (("llava-onevision-qwen2-0.5b-ov-hf", SPEC), ("llava-onevision-qwen2-7b-ov-hf", SPEC_7B)):
        imported = importer.import_spec(str(ROOT / "tests" / "fixtures" / "hub" / fixture))
        theirs = api.load_spec(str(spec))
        assert imported.spec.anyres == theirs.anyres and len(theirs.anyres.pinpoints) == 36
        assert [(m.name, m.type, m.parameters, dict(m.inputs)) for m in imported.spec.modules] == [
            (m.name, m.type, m.parameters, dict(m.inputs)) for m in theirs.modules
        ]
    language = api.load_spec(str(SPEC)).module("language").inputs
    assert (language["max_tiles"], language["anyres_side"], language["tie_embeddings"], language["qkv_bias"]) == (9, 27, True, True)


def test_a_sequence_shorter_than_the_image_is_refused():
    from compiler.errors import MemspecError

    with pytest.raises(MemspecError) as exc:
        api.estimate(str(SPEC), micro_batch=1, seq_len=4096, image_size=[1080, 1920])
    assert "E723" in exc.value.render() and "(1 x 7269 = 7269 at image size 1080 x 1920)" in exc.value.render()


def test_a_config_with_another_aspect_ratio_rule_is_refused(tmp_path):
    import hubfixtures as hf

    from compiler.errors import MemspecError
    from compiler.inputs import importer

    fixture = ROOT / "tests" / "fixtures" / "hub" / "llava-onevision-qwen2-0.5b-ov-hf"
    folder = hf.edited_copy(fixture, tmp_path / "ov", lambda config: config.update(vision_aspect_ratio="anyres_max_4"))
    with pytest.raises(MemspecError) as exc:
        importer.import_spec(folder)
    assert "E713" in exc.value.render() and "anyres_max_9" in exc.value.render()
