"""Aya Vision (aya_vision: CohereForAI/aya-vision-8b): the import and its parameter counts, the
crop-to-patches tile count (GotOcr2ImageProcessor's aspect-ratio search, as InternVL's) in the tower,
projector and language contexts, the measuring builder's model and batch against the spec, and the
variants the formulas do not model refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "aya-vision-8b"
SPEC = ROOT / "specs" / "aya_vision" / "aya-vision-8b.yaml"
TILE, PER_TILE = 364, 169  # (364 / 14)^2 = 676 patches, 2 x 2 per token

# vision (SigLIP so400m/14 at 364, no head): patch conv 3 * 14 * 14 * 1152 + 1152 = 678_528, positions
#   676 * 1152 = 778_752, 27 * 15_239_504 layers, post-LN 2304
# projector: LayerNorm 2 * 4608 + linear_1 4608 * 28672 + 28672 + linear_2 14336 * 4096 + 4096
# language (Command R7B's Cohere2): the tied table 256000 * 4096 + 32 * 218_107_904 layers + norm 4096
COUNTS = {"vision": 412_926_192, "projector": 190_882_816, "language": 8_028_033_024}


def processor_tiles(height: int, width: int) -> int:
    """GotOcr2ImageProcessor.crop_image_to_patches at Aya Vision's settings (1 to 12 tiles of 364 px,
    the thumbnail when more than one), restated from get_optimal_tiled_canvas in tests/tile_reference.py."""
    from tile_reference import optimal_grid

    columns, rows = optimal_grid(height, width, TILE, 1, 12)
    return columns * rows + (1 if columns * rows > 1 else 0)


SIZES = [
    (364, 364),
    (728, 728),
    (768, 1024),
    (1024, 768),
    (364, 728),
    (1080, 1920),
    (4000, 300),
    (300, 4000),
    (500, 510),
    (1200, 900),
    (2000, 2000),
    (640, 1536),
]


def test_imports_as_aya_vision_with_the_published_count():
    assert hf.imported_counts(FIX, "aya_vision") == COUNTS
    assert sum(COUNTS.values()) == 8_631_842_032  # the published 8.63B


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(FIX)).spec
    assert hf.modules(written) == hf.modules(imported)


def test_the_search_itself():
    assert processor_tiles(364, 364) == 1  # one tile, no thumbnail
    assert processor_tiles(728, 728) == 5  # 2 x 2 + the thumbnail
    assert processor_tiles(1024, 768) == 13  # 3 x 4 + the thumbnail
    assert processor_tiles(364, 728) == 3  # 2 x 1 + the thumbnail


@pytest.mark.parametrize("size", SIZES)
def test_contexts_count_the_processors_tiles(size):
    h, w = size
    want = processor_tiles(h, w)
    assert [batch for batch, _ in hf.contexts(api.load_spec(SPEC), h, w).values()] == [want, want]  # vision, projector
    tiles = dict(api.library().formulas["cohere2_causal_lm"].lets)["tiles"]
    assert tiles({"tile": TILE, "canvas": 0, "image_h": h, "image_w": w}) == want


def test_image_positions_reach_the_estimate_and_the_text_model_is_unchanged():
    """728 x 728: 5 tiles x 169 positions scattered into the sequence (image_merge); Command R7B
    (no images) scales its logits, Aya Vision's lm_head does not."""
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=1024, image_size=[728, 728], trainable=["projector"])
    rows = {r.path: r for r in est.rows}
    assert rows["vision"].buffers == 5 * 3 * TILE * TILE * 2
    assert rows["language.image_merge[0]"].activations == 1024  # the bool mask [1, 1024, 1]
    ln = "projector.layernorm"  # the shuffled copy it saves, [5 x 169, 4608] bf16, and its fp32 mean and rstd
    assert rows[ln].activations == 5 * PER_TILE * 4608 * 2 + 2 * 5 * PER_TILE * 4
    with pytest.raises(MemspecError) as err:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, image_size=[1024, 768], trainable=["projector"])
    assert "13 x 169" in str(err.value) or "2197" in str(err.value)


def test_video_is_refused():
    with pytest.raises(MemspecError) as err:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, videos_per_sample=1, video_frames=8)
    assert "E327" in str(err.value)


def test_builder_counts_and_batch_equal_the_spec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import aya_vision, family_for

    assert family_for(FIX / "config.json") is aya_vision
    config, model = hf.meta_build(aya_vision, FIX)
    counts = hf.module_counts(aya_vision, model)
    assert counts == COUNTS
    for size in SIZES:
        assert aya_vision.tiles_per_image(config, list(size)) == processor_tiles(*size)
    batch = aya_vision.make_batch(
        config, {"experiment": "t", "micro_batch": 2, "seq_len": 1024, "images_per_sample": 1, "image_size": [728, 728]}, torch.bfloat16
    )
    assert tuple(batch["pixel_values"].shape) == (10, 3, TILE, TILE)
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [5 * PER_TILE] * 2


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        (None, "vision_feature_layer", -2, "vision_feature_layer"),
        (None, "vision_feature_select_strategy", "default", "strategy full"),
        (None, "downsample_factor", 3, "downsample_factor"),
        ("vision_config", "vision_use_head", True, "pooling head"),
        ("text_config", "model_type", "cohere", "Cohere2"),
        ("text_config", "hidden_act", "gelu", "SwiGLU"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    message = hf.refusal(FIX, tmp_path / "variant", where, key, value)
    assert words in message


def test_other_tile_bounds_are_refused(tmp_path):
    folder = tmp_path / "variant"
    shutil.copytree(FIX, folder)
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    processor["max_patches"] = 6
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    with pytest.raises(MemspecError) as err:
        importer.import_spec(str(folder))
    assert "1 to 12 tiles" in str(err.value)
