"""LLaVA-NeXT-Video: images as LLaVA-NeXT, videos as frames through the tower, pooled 2 x 2 to
144 positions each and merged apart from the images, worked by hand and checked against the
processor's count where transformers is installed."""

import re
from pathlib import Path

import pytest

from compiler import api
from compiler.errors import MemspecError

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "llava_next_video" / "llava-next-video-7b.yaml"
NEXT = ROOT / "specs" / "llava_next" / "llava-v1.6-vicuna-7b.yaml"


def _dims(report, path: str) -> dict[str, int]:
    row = next(r for r in report.rows if r.path == path)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", row.dims)}


def _paths(report) -> set[str]:
    return {r.path for r in report.rows}


def test_a_video_is_its_frames_through_the_tower_and_144_positions_each():
    report = api.estimate(str(SPEC), micro_batch=2, seq_len=4096, images_per_sample=0, videos_per_sample=1, video_frames=16)
    assert _dims(report, "vision.patch_embedding")["b"] == 2 * 16  # every frame, no tiles
    # one projector row of every frame's pooled positions: 2 x 16 x 144 = 4608
    assert _dims(report, "projector.projector.linear_1")["s"] == 4608
    assert _dims(report, "language.video_merge[0]")["image_tokens"] == 144
    assert "language.image_merge[0]" not in _paths(report)
    assert api.image_tokens_per_sample(report.nodes) == 16 * 144


def test_an_image_and_a_video_merge_apart():
    report = api.estimate(str(SPEC), micro_batch=1, seq_len=4096, image_size=[672, 672], videos_per_sample=1, video_frames=8)
    # 5 crops (the base image and 2 x 2 tiles) and 8 frames through the tower
    assert _dims(report, "vision.patch_embedding")["b"] == 5 + 8
    # the image's 5 crops x 576 and the frames' 8 x 144 positions through the projector
    assert _dims(report, "projector.projector.linear_1")["s"] == 5 * 576 + 8 * 144
    assert _dims(report, "language.image_merge[0]")["image_tokens"] == 2928
    assert _dims(report, "language.video_merge[0]")["image_tokens"] == 144
    assert api.image_tokens_per_sample(report.nodes) == 2928 + 8 * 144


def test_images_alone_estimate_as_llava_next():
    # the same checkpoint sizes (Vicuna-7B, vocab 32064) and the same image path
    ours = api.estimate(str(SPEC), micro_batch=1, seq_len=4096, image_size=[672, 672])
    theirs = api.estimate(str(NEXT), micro_batch=1, seq_len=4096, image_size=[672, 672])
    assert ours.allocated == theirs.allocated


def test_a_sequence_shorter_than_the_video_is_refused():
    with pytest.raises(MemspecError) as exc:
        api.estimate(str(SPEC), micro_batch=1, seq_len=4096, image_size=[672, 672], videos_per_sample=1, video_frames=16)
    assert "E723" in exc.value.render() and "(1 x 2928 + 16 x 144 = 5232 at image size 672 x 672)" in exc.value.render()
    # 32 frames alone fit 4096 (4608 would not): no image, so the image size does not matter
    with pytest.raises(MemspecError) as exc:
        api.estimate(str(SPEC), micro_batch=1, seq_len=4096, images_per_sample=0, videos_per_sample=1, video_frames=32)
    assert "(32 x 144 = 4608" in exc.value.render()
    api.estimate(str(SPEC), micro_batch=1, seq_len=4096, images_per_sample=0, videos_per_sample=1, video_frames=28)


def test_against_the_processors_count():
    pytest.importorskip("torch", reason="the builder's count runs transformers' functions")
    pytest.importorskip("transformers")
    from compiler.measure.families import llava_next_video

    config = llava_next_video.load_config(SPEC.parent / "hf" / "llava-next-video-7b" / "config.json")
    assert llava_next_video.frame_tokens(config) == 144  # (336 / 14)^2 // 4
    assert (config.spatial_pool_mode, config.spatial_pool_stride) == ("average", 2)


def test_import_reproduces_the_checked_in_spec_and_refuses_the_conv_resampler(tmp_path):
    import json
    import shutil

    from compiler.inputs import importer

    fixture = ROOT / "tests" / "fixtures" / "hub" / "LLaVA-NeXT-Video-7B-hf"
    imported = importer.import_spec(str(fixture))
    theirs = api.load_spec(str(SPEC))
    assert imported.spec.video_temporal_patch == theirs.video_temporal_patch == 1
    assert [(m.name, m.type, m.parameters, dict(m.inputs)) for m in imported.spec.modules] == [
        (m.name, m.type, m.parameters, dict(m.inputs)) for m in theirs.modules
    ]
    folder = tmp_path / "nv"
    shutil.copytree(fixture, folder)
    config = json.loads((folder / "config.json").read_text())
    config["spatial_pool_mode"] = "conv"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(MemspecError) as exc:
        importer.import_spec(str(folder))
    assert "E713" in exc.value.render() and "conv resampler" in exc.value.render()
