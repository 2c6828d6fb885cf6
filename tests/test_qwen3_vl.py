"""Qwen3-VL: the image size moves the token count as the processor does (smart_resize, factor 32,
its bounds from preprocessor_config.json), the DeepStack mergers are counted, a video is its
temporal patches, and the variants the formulas do not model are refused at import."""

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
HUB = ROOT / "tests" / "fixtures" / "hub"
QWEN3_VL_2B = str(ROOT / "specs" / "qwen3_vl" / "qwen3-vl-2b-instruct.yaml")


@pytest.mark.parametrize(
    "size, seen",
    [
        ((448, 448), (448, 448)),  # 14 x 14 = 196 tokens, the spec's default
        ((896, 672), (896, 672)),  # 28 x 21 = 588
        ((1000, 750), (992, 736)),  # each side to the nearest multiple of 32: 31.25 -> 31, 23.4 -> 23
        ((200, 200), (256, 256)),  # rounded 192^2 < min_pixels 65_536: beta = 200 / 256, ceil to 32s -> 8 x 8 = 64 tokens
        ((4800, 4800), (4096, 4096)),  # rounded 4800^2 > max_pixels 16_777_216: beta = 4800 / 4096, floor to 32s -> 128 x 128
    ],
)
def test_the_processors_resize_sets_the_image_tokens(size, seen):
    """preprocessor_config.json size: shortest_edge 65_536 and longest_edge 16_777_216 pixels
    (256^2 and 4096^2), patch 16 x merge 2."""
    report = api.estimate(QWEN3_VL_2B, micro_batch=1, seq_len=32768, image_size=list(size))
    assert report.setup.image_size == size and report.setup.image_hw == seen
    assert api.image_tokens_per_sample(report.nodes) == (seen[0] // 32) * (seen[1] // 32)


def test_the_deepstack_mergers_are_counted_and_save_when_they_train():
    """Three DeepStack mergers beside the final one; each keeps its features and their
    concatenated copy until the forward ends, [196, 2048] bf16 = 802_816 B each at 448 x 448."""
    common = dict(micro_batch=1, seq_len=1024, precision="bf16", optimizer={"type": "sgd", "impl": "foreach", "momentum": 0.0})
    trained = api.estimate(QWEN3_VL_2B, trainable=["projector", "language"], **common)
    (row,) = [r for r in trained.rows if r.path.startswith("projector.deepstack_merger_list") and r.type == "qwen3_vl_merger"]
    assert (row.path, row.count, row.held) == ("projector.deepstack_merger_list[0:3]", 3, 2 * 802_816)
    frozen = api.estimate(QWEN3_VL_2B, trainable=["language"], **common)
    assert frozen.allocated < trained.allocated


@pytest.mark.parametrize("frames, patches", [(16, 8), (15, 8), (1, 1)])
def test_a_video_is_its_temporal_patches_read_as_images(frames, patches):
    """As Qwen2-VL: F frames padded to a multiple of temporal_patch_size 2, each temporal patch
    read by the tower as an image of the frame size (196 tokens at 448 x 448)."""
    common = dict(
        micro_batch=1,
        seq_len=4096,
        image_size=[448, 448],
        trainable=["vision", "projector", "language"],
        precision="bf16",
        optimizer={"type": "sgd", "impl": "foreach", "momentum": 0.0},
    )
    video = api.estimate(QWEN3_VL_2B, images_per_sample=0, videos_per_sample=1, video_frames=frames, **common)
    images = api.estimate(QWEN3_VL_2B, images_per_sample=patches, **common)
    assert video.setup.vision_items == patches
    assert api.image_tokens_per_sample(video.nodes) == patches * 196
    assert (video.allocated, video.reserved) == (images.allocated, images.reserved)


def _edited(tmp_path: Path, **vision) -> str:
    return hf.edited_copy(HUB / "Qwen3-VL-2B-Instruct", tmp_path / "Qwen3-VL-2B-Instruct", lambda config: config["vision_config"].update(vision))


@pytest.mark.parametrize(
    "vision, message",
    [
        ({"hidden_act": "quick_gelu"}, "vision_act == 'gelu_pytorch_tanh' is false"),
        ({"out_hidden_size": 4096}, "vision_out == hidden is false"),
        ({"deepstack_visual_indexes": [1, 2, 3, 4, 5]}, "more than four DeepStack layers"),
    ],
)
def test_variants_not_modelled_are_refused(tmp_path, vision, message):
    with pytest.raises(MemspecError) as info:
        importer.import_spec(_edited(tmp_path, **vision))
    text = str(info.value)
    assert "E713" in text and "qwen3_vl family" in text and message in text, text


def test_the_moe_variant_is_not_mapped(tmp_path):
    """Qwen3-VL-MoE (qwen3_vl_moe) has experts in its language model: no family covers it."""
    folder = tmp_path / "moe"
    shutil.copytree(HUB / "Qwen3-VL-2B-Instruct", folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "qwen3_vl_moe"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(MemspecError) as info:
        importer.import_spec(str(folder))
    assert "E708" in str(info.value) and "'qwen3_vl_moe' is not covered by any family" in str(info.value)


def test_deepstack_levels_follow_the_config(tmp_path):
    """deepstack_visual_indexes' items are the DeepStack mergers (a list has no length in
    expressions: the family counts its first four items): two levels are the final merger
    25_174_016 and 2 * 25_180_160."""
    config = json.loads((HUB / "Qwen3-VL-2B-Instruct" / "config.json").read_text())
    config["vision_config"]["deepstack_visual_indexes"] = [5, 11]
    hf.write_checkpoint(tmp_path / "two", config, hf.qwen3_vl_tensors(config))
    two = importer.import_spec(str(tmp_path / "two"))
    assert two.header_parameters["projector"] == importer.formula_counts(two.spec)["projector"] == 25_174_016 + 2 * 25_180_160


def test_the_4b_checkpoint_imports(tmp_path):
    """Qwen3-VL-4B-Instruct's config.json is the 2B's with a wider, deeper text model (hidden
    2560, intermediate 9728, 36 layers, 32 query heads; out_hidden_size 2560) and the same tower.
    Projector: the merger 27_271_680 (LayerNorm 2 * 1024, 4096^2 + 4096, 2560 x 4096 + 2560) and
    3 DeepStack mergers 27_277_824; text: 36 * 100_930_816 layers (q, o 4096 x 2560, k, v
    1024 x 2560, q_norm, k_norm, MLP 3 * 2560 * 9728, norms) + the tied 151936 x 2560 table
    + norm 2560; 4_437_815_808 in all, the published 4.44B."""
    config = json.loads((HUB / "Qwen3-VL-2B-Instruct" / "config.json").read_text())
    config["text_config"].update(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32)
    config["vision_config"]["out_hidden_size"] = 2560
    hf.write_checkpoint(tmp_path / "4b", config, hf.qwen3_vl_tensors(config), shards=2)
    imported = importer.import_spec(str(tmp_path / "4b"))
    expected = {"vision": 306_242_560, "projector": 27_271_680 + 3 * 27_277_824, "language": 36 * 100_930_816 + 151936 * 2560 + 2560}
    assert imported.header_parameters == importer.formula_counts(imported.spec) == expected
    assert sum(expected.values()) == 4_437_815_808


def test_a_video_batch_is_what_the_real_rope_index_reads():
    """The measuring harness's video batch (specs/matrices/qwen3-vl-video.yaml: 8 frames of
    448 x 448, 4 temporal patches of 196 tokens, seq 2048) through transformers' own
    Qwen3-VL get_rope_index on real tensors, as a CUDA step runs it: one run of video tokens
    per temporal patch, each between vision_start and vision_end, gets every one of the 2,048
    tokens a position. As one run of 784 tokens (Qwen2-VL's layout) it got 1,460 (the first
    patch's 196 and the text) and failed, as on the H200."""
    pytest.importorskip("torch", reason="measuring needs torch")
    pytest.importorskip("transformers", reason="measuring needs transformers")
    from types import SimpleNamespace

    import torch
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    from compiler.measure.experiment import expand_matrix, model_config_path
    from compiler.measure.families import qwen2_vl, qwen3_vl

    name, exp = expand_matrix(ROOT / "specs" / "matrices" / "qwen3-vl-video.yaml")[0]
    config = qwen3_vl.load_config(model_config_path(Path(exp["model"])))
    batch = qwen3_vl.make_batch(config, exp, torch.bfloat16)
    ids, types = batch["input_ids"], batch["mm_token_type_ids"]
    assert ids.shape == (1, 2048) and int((ids == config.video_token_id).sum()) == 4 * 196
    assert int((ids == config.vision_start_token_id).sum()) == int((ids == config.vision_end_token_id).sum()) == 4
    assert int((batch["labels"] != -100).sum()) == 2048 - 4 * 198  # the marks are ignored as the video is
    assert torch.equal(types == qwen2_vl.VIDEO_TOKEN_TYPE, ids == config.video_token_id)  # the marks are text
    rope = SimpleNamespace(config=config)  # the model's methods read only its config
    rope.get_vision_position_ids = lambda *args, **kwargs: Qwen3VLModel.get_vision_position_ids(rope, *args, **kwargs)

    def positions(b):
        return Qwen3VLModel.get_rope_index(rope, b["input_ids"], b["mm_token_type_ids"], video_grid_thw=b["video_grid_thw"].clone())

    position_ids, _ = positions(batch)
    assert position_ids.shape == (3, 1, 2048)
    one_run = qwen2_vl.make_batch(config, exp, torch.bfloat16)
    with pytest.raises(RuntimeError, match="1460"):
        positions(one_run)
