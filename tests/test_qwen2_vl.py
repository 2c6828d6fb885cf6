"""Qwen2-VL and Qwen2.5-VL: the import reproduces the checkpoints' parameter counts per module,
and the image size moves the estimate the way the processor moves the token count."""

from __future__ import annotations

from pathlib import Path

import pytest

from compiler import api
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
HUB = ROOT / "tests" / "fixtures" / "hub"


@pytest.mark.parametrize(
    "fixture, expected",
    [
        (
            "Qwen2-VL-7B-Instruct",
            {
                # patch embedding 1280 * 3 * 2 * 14 * 14 = 1_505_280 + 32 blocks * 19_677_440
                "vision": 631_183_360,
                # LayerNorm 2 * 1280 + 5120 * 5120 + 5120 + 3584 * 5120 + 3584
                "projector": 44_575_744,
                # embeddings 152064 * 3584 = 544_997_376 + 28 * 233_057_792 + norm 3584 + lm_head 544_997_376
                "language": 7_615_616_512,
            },
        ),
        (
            "Qwen2.5-VL-7B-Instruct",
            {
                "vision": 631_975_680,  # 1_505_280 + 32 * 19_702_200 (RMSNorms, SwiGLU with bias)
                "projector": 44_574_464,  # RMSNorm 1280 + the same MLP
                "language": 7_615_616_512,
            },
        ),
    ],
)
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
    report = api.estimate(str(ROOT / "specs" / "qwen2_vl" / "qwen2-vl-7b-instruct.yaml"), micro_batch=1, seq_len=2048, image_size=list(size))
    assert report.setup.image_size == size
    base = api.estimate(str(ROOT / "specs" / "qwen2_vl" / "qwen2-vl-7b-instruct.yaml"), micro_batch=1, seq_len=2048)
    assert (report.tensors > base.tensors) == (tokens > 256) or tokens == 256


@pytest.mark.parametrize(
    "size, seen",
    [
        ((4000, 4000), (3584, 3584)),  # rounded 4004^2 > max_pixels 12_845_056: beta = sqrt(16e6 / 12_845_056), floor to 28s -> 128 x 128 = 16_384 tokens
        ((14, 14), (56, 56)),  # rounded 0 x 0 < min_pixels 3136: beta = sqrt(3136 / 196) = 4, ceil to 28s -> 2 x 2 = 4 tokens
        ((1024, 768), (1036, 756)),  # within the bounds: each side to the nearest multiple of 28
    ],
)
def test_the_processors_resize_bounds_the_image_tokens(size, seen):
    """Qwen2.5-VL's preprocessor_config.json: min_pixels 3136, max_pixels 12_845_056. Outside them
    smart_resize rescales the image; a 4000 x 4000 image was counted as 143 x 143 = 20_449 tokens."""
    report = api.estimate(str(ROOT / "specs" / "qwen2_vl" / "qwen2.5-vl-7b-instruct.yaml"), micro_batch=1, seq_len=32768, image_size=list(size))
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


QWEN2_VL = str(ROOT / "specs" / "qwen2_vl" / "qwen2-vl-7b-instruct.yaml")


@pytest.mark.parametrize("frames, patches", [(16, 8), (15, 8), (1, 1)])
def test_a_video_is_its_temporal_patches_read_as_images(frames, patches):
    """Qwen2VLVideoProcessor pads F frames with the last to a multiple of temporal_patch_size 2
    (15 -> 16: 8 temporal patches, 1 -> 2: 1) and the tower attends over each temporal patch on
    its own (cu_seqlens repeat h x w grid_t times): one video is `patches` images of its frame
    size, 256 tokens each at 448 x 448. The one difference, video_grid_thw's 1 row against
    image_grid_thw's `patches`, is 24 B against 24 x patches B, both within one 512-byte block."""
    common = dict(
        micro_batch=1,
        seq_len=4096,
        image_size=[448, 448],
        trainable=["vision", "projector", "language"],
        precision="bf16",
        optimizer={"type": "sgd", "impl": "foreach", "momentum": 0.0},
    )
    video = api.estimate(QWEN2_VL, images_per_sample=0, videos_per_sample=1, video_frames=frames, **common)
    images = api.estimate(QWEN2_VL, images_per_sample=patches, **common)
    assert video.setup.vision_items == patches
    assert api.image_tokens_per_sample(video.nodes) == patches * 256
    assert (video.allocated, video.reserved) == (images.allocated, images.reserved)


def test_a_video_shows_in_the_setup_line_and_json(capsys):
    from compiler.cli import main

    argv = ["estimate", QWEN2_VL, "--micro-batch", "1", "--seq-len", "4096", "--images-per-sample", "0", "--videos-per-sample", "1", "--video-frames", "15"]
    assert main(argv) == 0
    assert "micro-batch 1 x 0 image(s) + 1 video(s) of 15 frames | seq 4096 (2048 video + 2048 text) |" in capsys.readouterr().out
    assert main(argv + ["--format", "json"]) == 0
    import json

    setup = json.loads(capsys.readouterr().out)["setup"]
    assert (setup["images_per_sample"], setup["videos_per_sample"], setup["video_frames"]) == (0, 1, 15)


@pytest.mark.parametrize(
    "spec, flags, code",
    [
        ("specs/llava/llava-1.5-7b.yaml", ["--videos-per-sample", "1", "--video-frames", "8"], "E327"),  # LLaVA-1.5 reads no video
        ("specs/qwen2_vl/qwen2-vl-7b-instruct.yaml", ["--videos-per-sample", "1"], "E328"),  # no frame count
        ("specs/qwen2_vl/qwen2-vl-7b-instruct.yaml", ["--video-frames", "8"], "E328"),  # frames, no video
    ],
)
def test_video_input_errors(spec, flags, code, capsys):
    from compiler.cli import main

    assert main(["estimate", str(ROOT / spec), "--micro-batch", "1", "--seq-len", "4096", *flags]) == 2
    assert f"{code} --" in capsys.readouterr().err


def test_the_import_writes_the_video_temporal_patch():
    # config.json vision_config.temporal_patch_size 2; a family without video writes none
    assert "video_temporal_patch: 2" in importer.import_spec(str(HUB / "Qwen2-VL-7B-Instruct")).text
    assert "video_temporal_patch" not in importer.import_spec(str(HUB / "llava-1.5-7b-hf")).text
