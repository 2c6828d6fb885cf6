"""GLM-4.1V (glm4v: zai-org/GLM-4.1V-9B-Thinking): the image positions and the tower's patches
follow Glm4vImageProcessor's smart_resize, the measuring builder's model and batch equal the
spec, and the variants the formulas do not model are refused."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from processors import image_processing

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "GLM-4.1V-9B-Thinking"
SPEC = ROOT / "specs" / "glm4v" / "glm-4.1v-9b-thinking.yaml"


def test_imports_as_glm4v():
    imported = importer.import_spec(str(FIX))
    assert imported.family == "glm4v"
    assert [m.type for m in imported.spec.modules] == ["glm4v_vision_tower", "glm4v_merger", "glm_causal_lm"]
    assert sum(imported.header_parameters.values()) == 10_292_777_472


@pytest.mark.parametrize(
    ("size", "grid"),
    [
        ((448, 448), (16, 16)),
        ((1024, 768), (37, 27)),  # 1036 x 756: 36.57 rounds up, 27.43 down
        ((126, 126), (4, 4)),  # 4.5 rounds to even
        ((70, 70), (3, 3)),  # under min_pixels / 2: scaled up, ceil(70 x sqrt(6272 / 4900) / 28) = 3
    ],
)
def test_image_positions_follow_the_processor(size, grid):
    """(h / 28) x (w / 28) positions per image after smart_resize; the tower sees 4 patches each."""
    rows, cols = grid
    report = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, image_size=list(size))
    assert api.image_tokens_per_sample(report.nodes) == rows * cols
    tower = next(n for n in report.nodes if n.inst.path == "vision")
    assert tower.inst.scope["seq"] == 4 * rows * cols


def test_resize_equals_transformers():
    """The family's bounds (the processor's, halved for an image's two temporal copies) resize as
    Glm4vImageProcessor's smart_resize does, inside and beyond them."""
    smart_resize = image_processing("glm4v", "smart_resize")

    from compiler.measure.families import glm4v

    config = glm4v.load_config(FIX / "config.json")
    for h, w in [(448, 448), (1024, 768), (70, 70), (4000, 3000), (6000, 6000), (56, 56)]:
        expected = smart_resize(2, h, w, temporal_factor=2, factor=28, min_pixels=12544, max_pixels=9633792)
        gh, gw = glm4v.image_grid(config, [h, w])
        assert (gh * 14, gw * 14) == tuple(expected), (h, w)


def test_builder_counts_and_batch_equal_the_spec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for, glm4v

    assert family_for(FIX / "config.json") is glm4v
    config, model = hf.meta_build(glm4v, FIX)
    counts = hf.module_counts(glm4v, model)
    assert counts == importer.import_spec(str(FIX)).header_parameters
    batch = glm4v.make_batch(config, {"experiment": "t", "micro_batch": 2, "seq_len": 2048, "images_per_sample": 1, "image_size": [1024, 768]}, torch.bfloat16)
    assert tuple(batch["pixel_values"].shape) == (2 * 74 * 54, 3 * 2 * 14 * 14)
    assert batch["image_grid_thw"].tolist() == [[1, 74, 54]] * 2
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [999] * 2


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("vision_config", "hidden_act", "gelu", "SiLU"),
        ("vision_config", "attention_bias", True, "qkv bias"),
        ("text_config", "attention_dropout", 0.1, "dropout"),
        ("text_config", "hidden_act", "gelu", "silu"),
        ("vision_config", "out_hidden_size", 2048, "hidden size"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    def edit(config):
        config[where][key] = value

    with pytest.raises(MemspecError) as err:
        importer.import_spec(hf.edited_copy(FIX, tmp_path / "variant", edit))
    assert words in str(err.value)
