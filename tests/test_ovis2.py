"""Ovis2 (ovis2: thisisiron/Ovis2-2B-hf and -1B-hf): the import and its parameter counts, the tile
count (Ovis2ImageProcessor's covering-area grid, the expression function `covering_tiles`,
against transformers' own get_min_tile_covering_grid) in the tower, projector and language
contexts, the visual tokenizer's rows in an estimate, the measuring builder's model and batch
against the spec, and the variants the formulas do not model refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from compiler.library.expr_python import FUNCTIONS

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "Ovis2-2B-hf"
SPEC = ROOT / "specs" / "ovis2" / "ovis2-2b-hf.yaml"
TILE, PER_TILE, WORDS, VOCAB = 448, 256, 65531, 65536  # (448 / 14 / 2)^2 visual tokens per tile

# vision (AIMv2-large/14 at 448): patch conv 3 * 14 * 14 * 1024 + 1024 = 603_136, RMSNorm 1024, positions
#   1024 * 1024 = 1_048_576, 24 * 12_847_104 layers, final RMSNorm 1024: AIMv2-large-patch14-448's 309_984_256
# projector: head_linear 4096 * 65531 = 268_414_976, head_norm 2 * 65531, table 65536 * 1536 = 100_663_296
# language (Qwen2.5-1.5B, tied): table 151936 * 1536 + 28 * 46_797_824 layers + norm 1536
COUNTS = {"vision": 309_984_256, "projector": 369_209_334, "language": 1_543_714_304}

SIZES = [
    (448, 448),
    (896, 896),
    (1024, 1024),
    (768, 1024),
    (1024, 768),
    (640, 1536),
    (1080, 1920),
    (4000, 300),
    (300, 4000),
    (500, 510),
    (1200, 900),
    (2000, 2000),
    (100, 100),
    (448, 1344),
]


def processor_tiles(height: int, width: int, max_patches: int = 12) -> int:
    """Ovis2ImageProcessor.crop_image_to_patches' image count: transformers' own grid search
    (image_processing_pil_ovis2, which needs no torchvision), plus the thumbnail."""
    pil = pytest.importorskip("transformers.models.ovis2.image_processing_pil_ovis2")
    columns, rows = pil.get_min_tile_covering_grid((height, width), TILE, max_patches, 0.9)
    blocks = columns * rows
    return blocks + 1 if blocks > 1 else 1


def test_imports_as_ovis2_with_the_published_count():
    assert hf.imported_counts(FIX, "ovis2") == COUNTS
    assert sum(COUNTS.values()) == 2_222_907_894  # the published 2.22B


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(FIX)).spec
    assert hf.modules(written) == hf.modules(imported)


def test_covering_tiles_is_the_processors_search():
    covering = FUNCTIONS["covering_tiles"]
    assert covering(448, 448, TILE, 12) == 1  # one tile covers it all, no thumbnail
    assert covering(896, 896, TILE, 12) == 5  # 2 x 2 + the thumbnail
    assert covering(1024, 1024, TILE, 12) == 10  # 2 x 2 covers 0.766: 3 x 3 + the thumbnail
    for h in range(1, 3100, 61):
        for w in range(1, 3100, 67):
            assert covering(h, w, TILE, 12) == processor_tiles(h, w), (h, w)
    for size in SIZES:
        for max_patches in (1, 2, 6, 9, 12):
            assert covering(*size, TILE, max_patches) == processor_tiles(*size, max_patches=max_patches)
    with pytest.raises(ValueError, match="covering_tiles"):
        covering(448, 448, TILE, 65)


@pytest.mark.parametrize("size", SIZES)
def test_contexts_count_the_processors_tiles(size):
    h, w = size
    want = processor_tiles(h, w)
    assert [batch for batch, _ in hf.contexts(api.load_spec(SPEC), h, w).values()] == [want, want]  # vision, projector
    tiles = dict(api.library().formulas["llama_causal_lm"].lets)["tiles"]
    assert tiles({"tile": TILE, "covering": 12, "image_h": h, "image_w": w}) == want


def test_the_visual_tokenizer_rows():
    """896 x 896: 5 tiles; trained, head_linear saves the merged copy, head_norm the logits, the
    softmax its probabilities, the table the padded copy (each [1280, ~65536] bf16); the image
    merge saves its mask and the five indicator masks."""
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, image_size=[896, 896], trainable=["projector"])
    rows = {r.path: r for r in est.rows}
    tokens = 5 * PER_TILE
    assert rows["vision"].buffers == 5 * 3 * TILE * TILE * 2  # pixel_values
    assert rows["projector.head_linear"].activations == tokens * 4096 * 2
    assert rows["projector.head_norm"].activations == tokens * WORDS * 2 + 2 * tokens * 4
    assert rows["projector.softmax"].activations == tokens * WORDS * 2
    assert rows["projector.visual_embeddings_table"].activations == tokens * VOCAB * 2 + 512
    assert rows["language.image_merge[0]"].activations == 2048 + 5 * 2048
    with pytest.raises(MemspecError) as err:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, image_size=[1024, 1024], trainable=["projector"])
    assert "2560" in str(err.value)


def test_builder_counts_and_batch_equal_the_spec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for, ovis2

    assert family_for(FIX / "config.json") is ovis2
    config, model = hf.meta_build(ovis2, FIX)
    counts = hf.module_counts(ovis2, model)
    assert counts == COUNTS
    for size in SIZES:
        assert ovis2.tiles_per_image(config, list(size)) == processor_tiles(*size)
    batch = ovis2.make_batch(config, {"experiment": "t", "micro_batch": 2, "seq_len": 2048, "images_per_sample": 1, "image_size": [896, 896]}, torch.bfloat16)
    assert tuple(batch["pixel_values"].shape) == (10, 3, TILE, TILE)
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [5 * PER_TILE] * 2
    for marker in config.visual_indicator_token_ids:
        assert (batch["input_ids"] == marker).sum(dim=1).tolist() == [1, 1]
    assert (batch["labels"] != -100).sum(dim=1).tolist() == [2048 - 5 * PER_TILE - 5] * 2


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("vision_config", "tokenize_function", "st_argmax", "tokenize_function"),
        ("vision_config", "hidden_act", "gelu", "SwiGLU"),
        ("vision_config", "hidden_stride", 3, "hidden_stride"),
        ("text_config", "model_type", "qwen3", "Qwen2"),
        ("text_config", "use_sliding_window", True, "full attention"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    message = hf.refusal(FIX, tmp_path / "variant", where, key, value)
    assert words in message


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("use_covering_area_grid", False, "covering-area grid"),
        ("size", {"height": 384, "width": 384}, "square image_size"),
        ("max_patches", 100, "more than 64"),
    ],
)
def test_other_processor_settings_are_refused(tmp_path, key, value, words):
    assert words in hf.refusal(FIX, tmp_path / "variant", "", key, value, "preprocessor_config.json")


def test_without_crop_to_patches_every_image_is_one_tile(tmp_path):
    folder = tmp_path / "variant"
    shutil.copytree(FIX, folder)
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    processor["crop_to_patches"] = False
    (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    spec = importer.import_spec(str(folder)).spec
    vision = next(m for m in spec.modules if m.name == "vision")
    assert vision.batch({"micro_batch": 1, "images_per_sample": 1, "image_h": 1024, "image_w": 1024, "seq_len": 4096, **vision.inputs}) == 1
