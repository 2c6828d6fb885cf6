"""Command A Vision (cohere2_vision: CohereLabs/command-a-vision-07-2025): the import and its
parameter counts, the tile count (Cohere2VisionImageProcessor's canvas search, the expression
function `canvas_tiles`, against a restatement in numpy of get_optimal_tiled_canvas) in the tower,
projector and language contexts, the projector without its LayerNorm, the measuring builder's
model and batch against the spec, and the variants the formulas do not model refused."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import numpy as np
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from compiler.library.expr_python import FUNCTIONS

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "command-a-vision-07-2025"
SPEC = ROOT / "specs" / "cohere2_vision" / "command-a-vision-07-2025.yaml"
TILE, PER_TILE = 512, 256  # (512 / 16)^2 = 1024 patches, 2 x 2 per token

# vision (SigLIP so400m/16 at 512, no head): patch conv 3 * 16 * 16 * 1152 + 1152 = 885_888, positions
#   1024 * 1152 = 1_179_648, 27 * 15_239_504 layers, post-LN 2304
# projector: linear_1 4608 * 36864 + 36864 + linear_2 18432 * 12288 + 12288 (no LayerNorm)
# language (Command A's Cohere2): the tied table 256000 * 12288 + 64 * 1_686_122_496 layers + norm 12288
COUNTS = {"vision": 413_534_448, "projector": 396_410_880, "language": 111_057_580_032}


def processor_tiles(height: int, width: int, tile: int = TILE, max_patches: int = 12) -> int:
    """Cohere2VisionImageProcessor.get_number_of_image_patches restated with numpy as
    get_optimal_tiled_canvas computes it (the grids sorted by tile count, the scales as float64
    arrays, argmax / argmin taking the first), plus the thumbnail when more than one tile."""
    grids = sorted([(c, r) for c in range(1, max_patches + 1) for r in range(1, max_patches + 1) if c * r <= max_patches], key=lambda g: g[0] * g[1])
    scales = np.min(np.array(grids) * tile / np.stack([width, height]), axis=-1, keepdims=True)
    if np.all(scales < 1):
        best = grids[np.argmax(scales)]
    else:
        best = grids[np.argmin(np.where(scales < 1.0, 10e9, scales))]
    blocks = best[0] * best[1]
    return 1 + blocks if max_patches > 1 and blocks > 1 else 1


SIZES = [
    (512, 512),
    (1024, 1024),
    (768, 1024),
    (1024, 768),
    (512, 1024),
    (1080, 1920),
    (4000, 300),
    (300, 4000),
    (500, 510),
    (1200, 900),
    (2000, 2000),
    (640, 1536),
    (2048, 2048),
    (100, 100),
]


def test_imports_as_cohere2_vision_with_the_published_count():
    assert hf.imported_counts(FIX, "cohere2_vision") == COUNTS
    assert sum(COUNTS.values()) == 111_867_525_360  # the published 112B


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(FIX)).spec
    assert hf.modules(written) == hf.modules(imported)


def test_the_search_itself():
    assert processor_tiles(512, 512) == 1  # one tile, no thumbnail
    assert processor_tiles(1024, 1024) == 5  # 2 x 2 + the thumbnail
    assert processor_tiles(768, 1024) == 5  # the smallest upscale: 2 x 2 (scale 4/3) + the thumbnail
    assert processor_tiles(2048, 2048) == 10  # every grid shrinks it: the first of scale 0.75, 3 x 3
    assert processor_tiles(100, 100) == 1  # 1 x 1 needs the smallest upscale


def test_canvas_tiles_is_the_processors_search():
    canvas = FUNCTIONS["canvas_tiles"]
    for h in range(1, 3100, 47):
        for w in range(1, 3100, 53):
            assert canvas(h, w, TILE, 12) == processor_tiles(h, w), (h, w)
    for size in SIZES:
        for max_patches in (1, 2, 6, 12, 24):
            assert canvas(*size, TILE, max_patches) == processor_tiles(*size, max_patches=max_patches)
    with pytest.raises(ValueError, match="canvas_tiles"):
        canvas(512, 512, TILE, 65)


@pytest.mark.parametrize("size", SIZES)
def test_contexts_count_the_processors_tiles(size):
    h, w = size
    want = processor_tiles(h, w)
    assert [batch for batch, _ in hf.contexts(api.load_spec(SPEC), h, w).values()] == [want, want]  # vision, projector
    tiles = dict(api.library().formulas["cohere2_causal_lm"].lets)["tiles"]
    assert tiles({"tile": TILE, "canvas": 12, "image_h": h, "image_w": w}) == want


def test_image_positions_reach_the_estimate_and_the_projector_has_no_norm():
    """1024 x 1024: 5 tiles x 256 positions scattered into the sequence (image_merge); the projector
    saves linear_1's input (the folded copy of the shuffled features), no LayerNorm row."""
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, image_size=[1024, 1024], trainable=["projector"])
    rows = {r.path: r for r in est.rows}
    assert rows["vision"].buffers == 5 * 3 * TILE * TILE * 2
    assert rows["language.image_merge[0]"].activations == 2048  # the bool mask [1, 2048, 1]
    assert not any(path.startswith("projector.layernorm") for path in rows)
    assert rows["projector.linear_1"].activations == 5 * PER_TILE * 4608 * 2
    with pytest.raises(MemspecError) as err:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, image_size=[2048, 2048], trainable=["projector"])
    assert "10 x 256" in str(err.value) or "2560" in str(err.value)


def test_video_is_refused():
    with pytest.raises(MemspecError) as err:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, videos_per_sample=1, video_frames=8)
    assert "E327" in str(err.value)


def test_builder_counts_and_batch_equal_the_spec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import cohere2_vision, family_for

    assert family_for(FIX / "config.json") is cohere2_vision
    config, model = hf.meta_build(cohere2_vision, FIX)
    counts = hf.module_counts(cohere2_vision, model)
    assert counts == COUNTS
    for size in SIZES:
        assert cohere2_vision.tiles_per_image(config, list(size)) == processor_tiles(*size)
    batch = cohere2_vision.make_batch(
        config, {"experiment": "t", "micro_batch": 2, "seq_len": 2048, "images_per_sample": 1, "image_size": [1024, 1024]}, torch.bfloat16
    )
    assert tuple(batch["pixel_values"].shape) == (10, 3, TILE, TILE)
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [5 * PER_TILE] * 2


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        (None, "downsample_factor", 3, "downsample_factor"),
        ("vision_config", "vision_use_head", True, "pooling head"),
        ("vision_config", "model_type", "clip_vision_model", "SigLIP"),
        ("text_config", "model_type", "cohere", "Cohere2"),
        ("text_config", "hidden_act", "gelu", "SwiGLU"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    message = hf.refusal(FIX, tmp_path / "variant", where, key, value)
    assert words in message


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("crop_to_patches", False, "crop_to_patches false"),
        ("size", {"height": 384, "width": 384}, "tiles of another size"),
        ("max_patches", 100, "1 to 64"),
        ("patch_size", 14, "image tokens per tile"),
    ],
)
def test_other_processor_settings_are_refused(tmp_path, key, value, words):
    assert words in hf.refusal(FIX, tmp_path / "variant", "", key, value, "preprocessor_config.json")
