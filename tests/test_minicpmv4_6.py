"""MiniCPM-V 4.6 (minicpmv4_6: openbmb/MiniCPM-V-4.6): the image positions and the tower's patches
follow MiniCPMV4_6ImageProcessor's cut of an image (its resized source image and, above 448^2
pixels, its slices; compared with the installed processor's own methods), video is refused, the
measuring builder's model and batch equal the spec, and the variants the formulas do not model
are refused."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from processors import image_processing

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "MiniCPM-V-4.6"
SPEC = ROOT / "specs" / "minicpmv4_6" / "minicpm-v-4.6.yaml"


def test_imports_as_minicpmv4_6():
    imported = importer.import_spec(str(FIX))
    assert imported.family == "minicpmv4_6"
    assert [m.type for m in imported.spec.modules] == ["minicpmv4_6_vision_tower", "minicpmv4_6_merger", "qwen3_5_causal_lm"]
    assert sum(imported.header_parameters.values()) == 1_300_428_016


@pytest.mark.parametrize(
    ("size", "units"),
    [
        ((448, 448), (8, 8)),
        ((336, 448), (7, 9)),  # int(448 / sqrt(4 / 3)) = 387, int(387 * 4 / 3) = 516: 6.91 and 9.21 units of 56
        ((224, 224), (8, 8)),  # upscaled to 448 x 448
        ((200, 1000), (4, 18)),  # 200 x 1000 = 448^2 at most: 200 x 1001 -> 3.57 and 17.88 units
        ((448, 224), (11, 6)),  # 633 x 316: 11.30 and 5.64 units
    ],
)
def test_image_positions_follow_the_processor(size, units):
    """(h / 56) x (w / 56) positions per image after find_best_resize; the tower sees 16 patches each."""
    rows, cols = units
    report = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, image_size=list(size))
    assert api.image_tokens_per_sample(report.nodes) == rows * cols
    tower = next(n for n in report.nodes if n.inst.path == "vision")
    assert tower.inst.scope["seq"] == 16 * rows * cols


@pytest.mark.parametrize(
    ("size", "pieces", "tokens"),
    [
        # 1344 x 896 (h x w): ceil(1344 x 896 / 448^2) = 6; 3 rows x 2 columns fit log(896 / 1344) exactly;
        # the source int(448 / sqrt(2 / 3)) = 548 x 365, to multiples of 56: 560 x 392, 10 x 7 = 70 tokens;
        # each slice 448 x 448, 8 x 8 = 64: 70 + 6 x 64 = 454
        ((1344, 896), 7, 70 + 6 * 64),
        # 1024 x 768: ceil(3.92) = 4, 2 x 2; the source 517 x 387 -> 504 x 392 (9 x 7 = 63); each slice
        # 512 x 384 resized alike, 63: 63 + 4 x 63 = 315
        ((1024, 768), 5, 5 * 63),
        # 2000 x 500: ceil(4.98) = 5, 4 rows x 1 column (log(1 / 4) exactly); the source 896 x 224 (16 x 4 =
        # 64); each slice 500 x 500 -> 448 x 448 (64): 5 x 64 = 320
        ((2000, 500), 5, 5 * 64),
        # 896 x 896: ceil(4.0) = 4, 2 x 2 slices of 448 x 448; the source 448 x 448: 5 x 64
        ((896, 896), 5, 5 * 64),
    ],
)
def test_a_sliced_image_is_its_source_image_and_slices(size, pieces, tokens):
    report = api.estimate(str(SPEC), micro_batch=2, seq_len=2048, images_per_sample=1, image_size=list(size))
    assert api.image_tokens_per_sample(report.nodes) == tokens
    rows = {r.path: r for r in report.rows}
    tower = next(n for n in report.nodes if n.inst.path == "vision")
    # batch the images, seq one image's patches (16 per token), one attention call per piece
    assert (tower.inst.scope["batch"], tower.inst.scope["seq"], tower.inst.scope["pieces"]) == (2, 16 * tokens, pieces)
    # pixel_values [1, 3, 14, 2 x 16 x tokens x 14] bf16 and target_sizes [2 x pieces, 2] int32
    assert rows["vision"].buffers == 2 * 16 * tokens * 588 * 2 + 2 * pieces * 2 * 4


def test_slicing_grows_the_estimate_in_the_image_terms():
    flat = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, trainable=["vision", "projector", "language"])
    sliced = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, trainable=["vision", "projector", "language"], image_size=[1344, 896])
    one, seven = ({r.path: r for r in e.rows} for e in (flat, sliced))
    # the trained tower's layers before the vit_merger: 7,264 patches where 1,024 were, their
    # per-call logsumexp and philox state aside (7 calls where 1 was)
    layer = "vision.layers[0:7].self_attn.core"
    calls = 2 * 512  # the seed and offset of one call in their own 512-byte blocks each
    lse = 16 * 4  # fp32 logsumexp per head and patch
    assert seven[layer].activations - 7 * calls - 7264 * lse == (one[layer].activations - 24 - 1024 * lse) * 7264 // 1024
    # the merger's pre_norm input: 454 tokens x 4 x 1152 where 64 were
    assert seven["projector.pre_norm"].activations * 64 == one["projector.pre_norm"].activations * 454
    # the language model's scattered features: 454 positions where 64 were
    assert api.image_tokens_per_sample(sliced.nodes) == 454 and api.image_tokens_per_sample(flat.nodes) == 64
    assert sliced.allocated > flat.allocated


def test_eager_scores_are_each_pieces_own():
    """Eager runs one call per piece: the scores are the source image's 1,120^2 and six slices'
    1,024^2 per head, not the image's 7,264^2."""
    est = api.estimate(
        str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, attention="eager", trainable=["vision", "projector", "language"], image_size=[1344, 896]
    )
    core = {r.path: r for r in est.rows}["vision.layers[0:7].self_attn.core"]
    x = 7264 * 1152 * 2  # q, k and v [7264, 1152] bf16 each
    scores = 16 * (1120**2 + 6 * 1024**2)  # 120_733_696
    # q, k, v, the fp32 softmax output and its bf16 cast
    assert core.activations == 3 * x + scores * (4 + 2)


def test_slicing_equals_transformers():
    """The expression functions' statement of the slicing (minicpmv_slicing: the measuring builder's
    pieces, the family's positions) is MiniCPMV4_6ImageProcessor's own: get_sliced_grid, find_best_resize
    of the source image and get_refine_size's slices, at sizes it slices and sizes it does not."""
    processor_class = image_processing("minicpmv4_6", "MiniCPMV4_6ImageProcessorPil")
    processor = processor_class()

    from compiler.measure.families import minicpmv4_6

    config = minicpmv4_6.load_config(FIX / "config.json")
    sizes = [(448, 448), (336, 448), (224, 224), (200, 1000), (448, 224), (100, 1500), (30, 40), (1344, 896), (1024, 768), (2000, 500)]
    sizes += [(h, w) for h in range(300, 4000, 173) for w in range(250, 4000, 191)]
    for h, w in sizes:
        grid = processor.get_sliced_grid((h, w), 9, 448)
        source = processor.find_best_resize((h, w), 448, 14, "16x", allow_upscale=grid is None)
        expected = [tuple(source)]
        if grid is not None:
            rh, rw = processor.get_refine_size((h, w), grid, 448, 14, "16x", allow_upscale=True)
            expected += [(rh // grid[0], rw // grid[1])] * (grid[0] * grid[1])
        assert minicpmv4_6.slice_sizes(config, [h, w]) == expected, (h, w)
    for h, w in sizes[:10]:
        pieces = minicpmv4_6.slice_sizes(config, [h, w])
        report = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, image_size=[h, w])
        assert api.image_tokens_per_sample(report.nodes) == sum(ph // 56 * (pw // 56) for ph, pw in pieces), (h, w)


def test_video_is_refused():
    """A video: the spec takes none (E327)."""
    with pytest.raises(MemspecError) as err:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, videos_per_sample=1, video_frames=4)
    assert err.value.diagnostics[0].code == "E327"


def test_builder_counts_and_batch_equal_the_spec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for, minicpmv4_6

    assert family_for(FIX / "config.json") is minicpmv4_6
    config, model = hf.meta_build(minicpmv4_6, FIX)
    # the tied lm_head is the embeddings' table, counted once
    counts = hf.module_counts(minicpmv4_6, model)
    assert counts == importer.import_spec(str(FIX)).header_parameters
    batch = minicpmv4_6.make_batch(
        config, {"experiment": "t", "micro_batch": 2, "seq_len": 2048, "images_per_sample": 1, "image_size": [336, 448]}, torch.bfloat16
    )
    assert tuple(batch["pixel_values"].shape) == (1, 3, 14, 2 * 28 * 36 * 14)
    assert batch["target_sizes"].tolist() == [[28, 36]] * 2
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [63] * 2
    # 1344 x 896, sliced: the 560 x 392 source image (40 x 28 patches) then 3 x 2 slices of 32 x 32
    sliced = minicpmv4_6.make_batch(
        config, {"experiment": "t", "micro_batch": 1, "seq_len": 2048, "images_per_sample": 1, "image_size": [1344, 896]}, torch.bfloat16
    )
    assert tuple(sliced["pixel_values"].shape) == (1, 3, 14, 7264 * 14)
    assert sliced["target_sizes"].tolist() == [[40, 28]] + [[32, 32]] * 6
    assert (sliced["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [70 + 6 * 64]


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        (None, "downsample_mode", "4x", "4x"),
        (None, "merger_times", 2, "merger_times"),
        (None, "drop_vision_last_layer", True, "drop_vision_last_layer"),
        ("text_config", "linear_num_value_heads", 32, "grouped value heads"),
        ("text_config", "hidden_act", "gelu", "silu"),
        ("vision_config", "hidden_act", "gelu", "tanh"),
        ("text_config", "attention_dropout", 0.1, "dropout"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    message = hf.refusal(FIX, tmp_path / "variant", where, key, value)
    assert words in message
