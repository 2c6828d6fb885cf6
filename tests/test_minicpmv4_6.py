"""MiniCPM-V 4.6 (minicpmv4_6: openbmb/MiniCPM-V-4.6): the image positions and the tower's patches
follow MiniCPMV4_6ImageProcessor's resize of an unsliced image, a sliced image and video are
refused, the measuring builder's model and batch equal the spec, and the variants the formulas do
not model are refused."""

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


def test_resize_equals_transformers():
    """The measuring builder's slice size is MiniCPMV4_6ImageProcessor's find_best_resize of an image
    it does not slice (get_sliced_grid None), and the family's units are that size / 56."""
    processor_class = image_processing("minicpmv4_6", "MiniCPMV4_6ImageProcessorPil")
    processor = processor_class()

    from compiler.measure.families import minicpmv4_6

    config = minicpmv4_6.load_config(FIX / "config.json")
    for h, w in [(448, 448), (336, 448), (224, 224), (200, 1000), (448, 224), (100, 1500), (30, 40)]:
        assert processor.get_sliced_grid((h, w), 9, 448) is None
        expected = processor.find_best_resize((h, w), 448, 14, "16x", allow_upscale=True)
        assert minicpmv4_6.slice_size(config, [h, w]) == tuple(expected), (h, w)
        report = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, image_size=[h, w])
        assert api.image_tokens_per_sample(report.nodes) == expected[0] // 56 * (expected[1] // 56), (h, w)


def test_sliced_images_and_video_are_refused():
    """An image of more than 448^2 pixels is sliced by the processor (a thumbnail and a grid):
    refused at image_size (E725, the spec's image_slice_pixels) with the size that would do;
    448 x 448 itself is not; a video: the spec takes none (E327)."""
    with pytest.raises(MemspecError) as err:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, image_size=[896, 896])
    d = err.value.diagnostics[0]
    assert d.code == "E725" and "896 x 896 (802,816 pixels, above 200,704)" in d.message and "--image-size 448x448" in d.help
    api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, image_size=[448, 448])
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
