"""LLaVA-NeXT's anyres tiling: the tile grid and the image positions, worked by hand and
checked against transformers' own functions where transformers is installed."""

import re
from pathlib import Path

import pytest

from compiler import api
from compiler.pipeline.resolve import Anyres

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "llava_next" / "llava-v1.6-vicuna-7b.yaml"
PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))  # llava-v1.6 config.json
V16 = Anyres(336, PINPOINTS)


def _dims(report, path: str) -> dict[str, int]:
    row = next(r for r in report.rows if r.path == path)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", row.dims)}


def test_grid_is_the_pinpoint_with_the_most_effective_then_least_wasted_pixels():
    # 336 x 336 fits every pinpoint whole (effective 336^2 each); the least wasted are the two
    # 336 x 672 ones (225_792 - 112_896), and the first listed, (336, 672) = 1 row x 2 columns, wins
    assert V16.grid(336, 336) == (1, 2)
    # 672 x 672: only (672, 672) keeps all 451_584 pixels
    assert V16.grid(672, 672) == (2, 2)
    # 1344 x 336 (h x w): (1008, 336) scales by 0.75 to 1008 x 252 = 254_016 pixels, (672, 336)
    # and (672, 672) by 0.5 to 672 x 168 = 112_896, the others by 0.25
    assert V16.grid(1344, 336) == (3, 1)
    assert V16.grid(336, 1344) == (1, 3)


@pytest.mark.parametrize(
    "h, w, crops, tokens",
    [
        # 1 x 2 tiles: 24 x 48 features; the image is taller (1 < 48 / 24): 336 * 24 // 336 = 24
        # columns kept, padding (48 - 24) // 2 = 12 each side -> 24 x (24 + 1) = 600 + 576 base
        (336, 336, 3, 1176),
        # 2 x 2 tiles: 48 x 48, nothing to unpad -> 48 x 49 = 2352 + 576
        (672, 672, 5, 2928),
        # 3 x 1 tiles: 72 x 24; taller (336 / 1344 < 24 / 72): 336 * 72 // 1344 = 18 columns,
        # padding 3 each side -> 72 x (18 + 1) = 1368 + 576
        (1344, 336, 4, 1944),
        # 1 x 3 tiles: 24 x 72; wider: 336 * 72 // 1344 = 18 rows -> 18 x 73 = 1314 + 576
        (336, 1344, 4, 1890),
    ],
)
def test_crops_and_image_positions(h, w, crops, tokens):
    report = api.estimate(str(SPEC), micro_batch=2, seq_len=4096, image_size=[h, w])
    assert _dims(report, "vision.patch_embedding")["b"] == 2 * crops  # the base image and its tiles
    assert _dims(report, "projector.projector.linear_1")["b"] == 2 * crops
    assert _dims(report, "language.image_merge[0]")["image_tokens"] == tokens


def test_against_transformers_select_best_resolution_and_pack_image_features():
    pytest.importorskip("torch", reason="the builder's count runs transformers' functions")
    pytest.importorskip("transformers")
    from transformers.image_processing_utils import select_best_resolution

    from compiler.measure.families import llava_next

    config = llava_next.load_config(ROOT / "specs" / "llava_next" / "hf" / "llava-v1.6-vicuna-7b" / "config.json")
    assert tuple(map(tuple, config.image_grid_pinpoints)) == PINPOINTS
    sizes = [(h, w) for h in (200, 336, 480, 500, 672, 700, 1008, 1080, 1344) for w in (224, 336, 640, 672, 1000, 1344, 1920)]
    for h, w in sizes:
        ph, pw = select_best_resolution((h, w), list(map(list, PINPOINTS)))
        assert V16.grid(h, w) == (ph // 336, pw // 336), (h, w)
    for h, w in sizes[::4]:
        crops, tokens = llava_next.anyres(config, [h, w])
        report = api.estimate(str(SPEC), micro_batch=1, seq_len=4096, image_size=[h, w])
        assert _dims(report, "vision.patch_embedding")["b"] == crops, (h, w)
        assert _dims(report, "language.image_merge[0]")["image_tokens"] == tokens, (h, w)


# --------------------------------------------------------------------------- import


def _import(fixture: str):
    from compiler.inputs import importer

    return importer.import_spec(str(ROOT / "tests" / "fixtures" / "hub" / fixture))


def test_import_writes_the_tiling_and_reproduces_the_checked_in_spec():
    imported = _import("llava-v1.6-vicuna-7b-hf")
    assert imported.data["anyres"] == {"tile": 336, "grid_pinpoints": [list(p) for p in PINPOINTS]}
    assert imported.data["image_size"] == [672, 672]  # 2 x the tile: the largest square pinpoint
    assert imported.data["modules"]["vision"]["context"]["batch"] == "micro_batch * images_per_sample * (1 + grid_rows * grid_cols)"
    theirs = api.load_spec(str(SPEC))
    assert imported.spec.anyres == theirs.anyres == V16
    assert [(m.name, m.type, m.parameters, dict(m.inputs)) for m in imported.spec.modules] == [
        (m.name, m.type, m.parameters, dict(m.inputs)) for m in theirs.modules
    ]
    mistral = _import("llava-v1.6-mistral-7b-hf").data["modules"]["language"]["inputs"]
    assert (mistral["n_kv_heads"], mistral["intermediate"], mistral["sliding_window"]) == (8, 14336, 0)  # null window


def test_pinpoints_that_are_not_pairs_are_refused(tmp_path):
    import json
    import shutil

    from compiler.errors import MemspecError

    folder = tmp_path / "llava-next"
    shutil.copytree(ROOT / "tests" / "fixtures" / "hub" / "llava-v1.6-vicuna-7b-hf", folder)
    config = json.loads((folder / "config.json").read_text())
    config["image_grid_pinpoints"] = [[336, 672], [672]]
    (folder / "config.json").write_text(json.dumps(config))
    from compiler.inputs import importer

    with pytest.raises(MemspecError) as exc:
        importer.import_spec(str(folder))
    text = exc.value.render()
    assert "E717" in text and "image_grid_pinpoints is [[336, 672], [672]], not a list of [height, width] pixel pairs" in text


def test_a_tiled_spec_without_an_image_size_is_refused(tmp_path):
    from compiler.errors import MemspecError

    text = SPEC.read_text().replace("image_size: [672, 672]", "")
    assert text != SPEC.read_text()
    bare = tmp_path / "llava-next.yaml"
    bare.write_text(text.replace("config: hf/", f"config: {SPEC.parent}/hf/"))
    with pytest.raises(MemspecError) as exc:
        api.estimate(str(bare), micro_batch=1, seq_len=4096)
    assert "E717" in exc.value.render() and "--image-size HxW" in exc.value.render()
    assert (
        api.estimate(str(bare), micro_batch=1, seq_len=4096, image_size=[672, 672]).allocated == api.estimate(str(SPEC), micro_batch=1, seq_len=4096).allocated
    )


def test_a_sequence_shorter_than_the_tiled_image_is_refused():
    from compiler.errors import MemspecError

    with pytest.raises(MemspecError) as exc:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, image_size=[672, 672])
    assert "E723" in exc.value.render() and "(1 x 2928 = 2928 at image size 672 x 672)" in exc.value.render()
    api.estimate(str(SPEC), micro_batch=1, seq_len=2048, image_size=[1344, 336])  # 1944 positions fit
