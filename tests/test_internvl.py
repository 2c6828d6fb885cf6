"""InternVL 2.5 / 3: the dynamic-tile count, both checkpoint layouts, and estimates that follow
the tiles.

The tile count is the expression function `crop_to_patches` (specs/families/internvl.yaml, the
vision and projector contexts; formulas/llama_causal_lm.yaml, let `tiles`), the processor's
aspect-ratio search in its float arithmetic, which the measuring builder uses too;
tests/tile_reference.py restates the search from its source, and the two are compared over many
sizes, exact ties between grid ratios included.
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.inputs import importer
from compiler.errors import MemspecError

ROOT = Path(__file__).resolve().parent.parent
SPECS = {"native": ROOT / "specs" / "internvl" / "internvl3-8b-hf.yaml", "remote": ROOT / "specs" / "internvl" / "internvl3-8b.yaml"}
TILE, MAX_TILES = 448, 12


def processor_tiles(height: int, width: int) -> int:
    """The processor's tile count, min 1, max 12 tiles of 448 px, thumbnail included: the
    restatement of get_optimal_tiled_canvas in tests/tile_reference.py (torchvision is not needed)."""
    from tile_reference import optimal_grid

    columns, rows = optimal_grid(height, width, TILE, 1, MAX_TILES)
    return columns * rows + (1 if columns * rows > 1 else 0)


RATIOS = sorted({Fraction(p, q) for p in range(1, MAX_TILES + 1) for q in range(1, MAX_TILES + 1) if p * q <= MAX_TILES})
MIDPOINTS = {(a + b) / 2 for a, b in zip(RATIOS, RATIOS[1:])}


def sizes() -> list[tuple[int, int]]:
    rng = random.Random(7)
    grid = [(h, w) for h in range(14, 2900, 53) for w in range(14, 2900, 59)]
    wide = [(rng.randint(1, 6000), rng.randint(1, 6000)) for _ in range(3000)]
    named = [(448, 448), (896, 896), (1344, 1344), (448, 896), (896, 448), (1024, 768), (768, 1024), (1080, 1920), (4000, 300)]
    # an exact midpoint between two grid ratios, where the processor's float comparison
    # decides: w / h = (1/2 + 2/3) / 2 = 7/12, and (1 + 4/3) / 2 = 7/6
    ties = [(12 * k, 7 * k) for k in (16, 64, 100)] + [(6 * k, 7 * k) for k in (16, 64, 100)]
    assert all(Fraction(w, h) in MIDPOINTS for h, w in ties)
    return grid + wide + named + ties


def test_the_search_itself():
    # 448 x 448: ratio 1, area 448^2, not over half of 2 x 2 tiles: one tile, no thumbnail
    assert processor_tiles(448, 448) == 1
    # 896 x 896: area 4 x 448^2 > half of 2 x 2 (2 x 448^2) but not of 3 x 3: 4 + thumbnail
    assert processor_tiles(896, 896) == 5
    # 1024 high x 768 wide: w / h = 0.75 = 3 / 4 exactly, 12 tiles (3 columns x 4 rows) + thumbnail
    assert processor_tiles(1024, 768) == 13
    # 448 high x 896 wide: ratio 2 = 2 / 1, area 2 x 448^2 not over half of 4 x 2 (4 x 448^2): 2 + 1
    assert processor_tiles(448, 896) == 3


@pytest.mark.parametrize("layout", sorted(SPECS))
def test_spec_contexts_count_the_processors_tiles(layout):
    spec = api.load_spec(SPECS[layout])
    for h, w in sizes():
        want = processor_tiles(h, w)
        assert [batch for batch, _ in hf.contexts(spec, h, w).values()] == [want, want], (h, w)  # vision, projector


def test_language_formula_counts_the_processors_tiles():
    formula = api.library().formulas["llama_causal_lm"]
    tiles = dict(formula.lets)["tiles"]
    for h, w in sizes():
        assert tiles({"tile": TILE, "image_h": h, "image_w": w, "covering": 0}) == processor_tiles(h, w), (h, w)
    assert tiles({"tile": 0, "image_h": 1024, "image_w": 768, "covering": 0}) == 0  # any other model: no tiles


# vision (InternViT-300M): patch conv 1024 * 3 * 14 * 14 + 1024 = 603_136, class token 1024,
#   positions 1025 * 1024 = 1_049_600, 24 layers x 12_598_272 (q, k, v, out 4 * (1024^2 + 1024),
#   2 layer scales 2048, 2 LayerNorms 4096, fc1 4096 * 1024 + 4096, fc2 1024 * 4096 + 1024)
# projector: LayerNorm 2 * 4096 + 4096 * 3584 + 3584 + 3584^2 + 3584 = 27_540_480
# language (Qwen2.5-7B, vocab 151674): 28 * 233_057_792 + 2 * 151674 * 3584 (untied) + 3584
COUNTS_8B = {"vision": 304_012_288, "projector": 27_540_480, "language": 7_612_820_992}
# vision (InternViT-6B): patch conv 3200 * 588 + 3200 = 1_884_800, class 3200, positions
#   1025 * 3200 = 3_280_000, 45 layers x 122_918_400 (q, k, v 3200^2 without bias, out
#   3200^2 + 3200, q/k norms 2 * 3200, layer scales 6400, RMSNorms 6400, fc1 3200 * 12800 + 12800,
#   fc2 12800 * 3200 + 3200)
# projector: LayerNorm 2 * 12800 + 12800 * 5120 + 5120 + 5120^2 + 5120 = 91_786_240
# language (Qwen2.5-32B, vocab 151674): 64 * 487_605_248 (q 5120^2 + 5120, k, v 1024 x 5120 + 1024
#   each, o 5120^2, MLP 3 * 5120 * 27648, norms 2 * 5120) + 2 * 151674 * 5120 + 5120
COUNTS_38B = {"vision": 5_536_496_000, "projector": 91_786_240, "language": 32_759_882_752}
LAYOUTS = {"8b": ("InternVL3-8B", "InternVL3-8B-hf", COUNTS_8B), "38b": ("InternVL3-38B", "InternVL3-38B-hf", COUNTS_38B)}


@pytest.mark.parametrize("size", sorted(LAYOUTS))
def test_both_layouts_import_to_the_same_counts_and_inputs(size):
    remote, native, counts = LAYOUTS[size]
    specs = []
    for fixture in (remote, native):
        imported = importer.import_spec(str(hf.FIXTURES / fixture))
        assert imported.header_parameters == counts
        assert importer.formula_counts(imported.spec) == counts
        specs.append({m.name: dict(m.inputs) for m in imported.spec.modules})
    assert specs[0] == specs[1]


@pytest.mark.parametrize(
    "model, fixture",
    [("internvl3-8b", "InternVL3-8B"), ("internvl3-8b-hf", "InternVL3-8B-hf"), ("internvl3-38b", "InternVL3-38B"), ("internvl3-38b-hf", "InternVL3-38B-hf")],
)
def test_the_checked_in_specs_are_what_import_writes(model, fixture):
    written = api.load_spec(ROOT / "specs" / "internvl" / f"{model}.yaml")
    imported = importer.import_spec(str(hf.FIXTURES / fixture)).spec
    assert hf.modules(written) == hf.modules(imported)


def test_intern_vit_6b_inputs():
    vision = next(m for m in api.load_spec(ROOT / "specs" / "internvl" / "internvl3-38b.yaml").modules if m.name == "vision")
    assert (vision.inputs["rms_norm"], vision.inputs["qkv_bias"], vision.inputs["qk_norm"]) == (True, False, True)
    assert (vision.inputs["hidden"], vision.inputs["n_layers"], vision.inputs["n_heads"]) == (3200, 45, 25)


def _refusal(tmp_path, edit) -> str:
    import json

    config = json.loads((hf.FIXTURES / "InternVL3-8B" / "config.json").read_text())
    edit(config)
    folder = tmp_path / "ckpt"
    hf.write_checkpoint(folder, config, hf.internvl_tensors(config))
    with pytest.raises(MemspecError) as exc:
        importer.import_spec(str(folder))
    return exc.value.render()


def test_internlm3_language_model_is_refused(tmp_path):
    # InternVL3-9B: the same tower with InternLM3-8B (llm_config model_type internlm3)
    message = _refusal(tmp_path, lambda c: c["llm_config"].update(model_type="internlm3"))
    assert "E713" in message and "text_model == 'qwen2'" in message and "InternLM3" in message


# InternVL2.5-8B (tests/fixtures/hub/InternVL2_5-8B, InternLM2.5-7B-chat language model):
# vision and its 304_012_288 as InternVL3-8B's (InternViT-300M)
# projector: LayerNorm 2 * 4096 + 4096 * 4096 + 4096 + 4096^2 + 4096 = 33_570_816
# language: 32 layers x 218_112_000 (wqkv (32 + 2 * 8) * 128 x 4096 = 25_165_824, wo 4096^2 = 16_777_216,
#   w1, w3, w2 3 * 4096 * 14336 = 176_160_768, attention_norm, ffn_norm 2 * 4096) = 6_979_584_000
#   + tok_embeddings and output 2 * 92553 * 4096 = 758_194_176 + norm 4096 = 7_737_782_272
# total 8_075_365_376 (the published ~8.08B)
COUNTS_2_5_8B = {"vision": 304_012_288, "projector": 33_570_816, "language": 7_737_782_272}


def test_internlm2_checkpoint_imports_with_its_counts():
    imported = importer.import_spec(str(hf.FIXTURES / "InternVL2_5-8B"))
    assert imported.header_parameters == COUNTS_2_5_8B
    assert importer.formula_counts(imported.spec) == COUNTS_2_5_8B
    assert sum(COUNTS_2_5_8B.values()) == 8_075_365_376
    language = next(m for m in imported.spec.modules if m.name == "language")
    assert (language.inputs["internlm2"], language.inputs["qkv_bias"], language.inputs["positions"]) == (True, False, 32768)


def test_the_checked_in_internlm2_spec_is_what_import_writes():
    written = api.load_spec(ROOT / "specs" / "internvl" / "internvl2_5-8b.yaml")
    imported = importer.import_spec(str(hf.FIXTURES / "InternVL2_5-8B")).spec
    assert hf.modules(written) == hf.modules(imported)


def test_internlm2_layers_in_the_estimate():
    """The InternLM2 layers' own terms, flash (the remote code's use_flash_attn path), seq 4096, batch 1."""
    est = api.estimate(
        str(ROOT / "specs" / "internvl" / "internvl2_5-8b.yaml"),
        micro_batch=1,
        seq_len=4096,
        image_size=[1024, 768],
        trainable=["projector", "language"],
        attention="flash_attention_2",
    )
    rows = {r.path: r for r in est.rows}
    layers = "language.internlm2_layers[0:32]"
    assert not any(p.startswith("language.layers[") for p in rows)
    attn, core = rows[layers + ".attention"], rows[layers + ".attention.core"]
    # every layer's rotary cache: inv_freq 64 * 4 + cos_cached, sin_cached 2 * 32768 * 128 * 2 (bf16)
    assert attn.buffers == 256 + 16_777_216
    # v's view keeps the wqkv output beyond v alive: 4096 tokens x (4096 + 1024) x 2 bytes
    assert attn.activations == 4096 * (4096 + 1024) * 2 == 41_943_040
    # the per-layer cos and sin the rotary saves: 2 x 4096 x 128 x 2
    assert rows[layers + ".attention.rotary"].activations == 2 * 4096 * 128 * 2
    # flash's core: q, k, v unrepeated (4096 x (4096 + 2 * 1024) x 2), the output 4096 x 4096 x 2,
    # logsumexp 32 x 4096 x 4, philox 24
    assert core.activations == 4096 * 6144 * 2 + 4096 * 4096 * 2 + 32 * 4096 * 4 + 24 == 84_410_392
    eager = api.estimate(
        str(ROOT / "specs" / "internvl" / "internvl2_5-8b.yaml"),
        micro_batch=1,
        seq_len=4096,
        image_size=[1024, 768],
        trainable=["projector", "language"],
        attention="eager",
    )
    eager_rows = {r.path: r for r in eager.rows}
    # eager repeats the grouped k and v (copies), so nothing saves v's view of the wqkv output
    assert eager_rows[layers + ".attention"].activations == 0
    assert eager_rows[layers + ".attention.core"].activations - core.activations == eager_only(4096, 32, 8, 128)


def eager_only(seq: int, heads: int, kv_heads: int, d: int) -> int:
    """What eager saves beyond flash in one grouped layer at batch 1 (attention_core): k and v repeated to every head
    instead of unrepeated, fp32 and bf16 probabilities, minus flash's output, logsumexp and philox seed / offset
    (eager's output, a contiguous copy, is saved by wo: charged on wo's row, not the kernel's)."""
    repeated = 2 * (seq * heads * d * 2 - seq * kv_heads * d * 2)
    probs = heads * seq * seq * (4 + 2)
    flash = seq * heads * d * 2 + heads * seq * 4 + 24
    return repeated + probs - flash


def test_other_vision_norm_is_refused(tmp_path):
    message = _refusal(tmp_path, lambda c: c["vision_config"].update(norm_type="batch_norm"))
    assert "E713" in message and "vision_norm = 'batch_norm'" in message


def test_other_tile_bounds_are_refused(tmp_path):
    message = _refusal(tmp_path, lambda c: c.update(max_dynamic_patch=6))
    assert "E713" in message and "max_tiles == 12" in message


def test_tiles_reach_the_estimate():
    """Thirteen tiles instead of one: 12 more tiles through the tower and projector, 12 x 256
    more image positions scattered into the same 4096-position sequence."""
    one = api.estimate(str(SPECS["native"]), micro_batch=1, seq_len=4096, image_size=[448, 448], trainable=["projector"])
    many = api.estimate(str(SPECS["native"]), micro_batch=1, seq_len=4096, image_size=[1024, 768], trainable=["projector"])
    rows = {r.path: r for r in many.rows}
    rows_one = {r.path: r for r in one.rows}
    vision_in = "vision"  # the tower's pixel buffer: 13 tiles x 3 x 448 x 448 x 2 bytes
    assert next(r for r in many.rows if r.path == vision_in).buffers == 13 * 3 * 448 * 448 * 2
    assert next(r for r in one.rows if r.path == vision_in).buffers == 3 * 448 * 448 * 2
    # the projector's LayerNorm saves its input: 13 tiles x 256 tokens x 4096 x 2 bytes (+ fp32 stats)
    ln = "projector.layer_norm"
    assert rows[ln].activations == 13 * 256 * 4096 * 2 + 2 * 13 * 256 * 4
    assert rows_one[ln].activations == 256 * 4096 * 2 + 2 * 256 * 4
    assert many.allocated > one.allocated


def test_measuring_builder_cuts_the_same_tiles():
    """The measured batches (compiler/measure/families/internvl.py) carry the tiles the
    estimates count."""
    from types import SimpleNamespace

    pytest.importorskip("torch")
    from compiler.measure.families import internvl as builder

    config = SimpleNamespace(
        preprocessor={"size": {"height": 448, "width": 448}, "min_patches": 1, "max_patches": 12}, vision_config=SimpleNamespace(image_size=[448, 448])
    )
    for h, w in sizes()[::7]:
        assert builder.tiles_per_image(config, [h, w]) == processor_tiles(h, w), (h, w)


def test_internlm2_hub_id_imports_and_estimates(tmp_path, monkeypatch, capsys):
    """`memspec import OpenGVLab/InternVL2_5-8B` and `memspec estimate OpenGVLab/InternVL2_5-8B ...` from an offline
    cache holding the fixture: the import writes the checked-in spec's modules, the estimate runs on it."""
    import json

    from huggingface_hub import constants

    from compiler import cli

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("MEMSPEC_CACHE", str(tmp_path / "memspec-cache"))
    monkeypatch.chdir(ROOT)
    hf.hub_cache(Path(constants.HF_HUB_CACHE), "OpenGVLab/InternVL2_5-8B", "InternVL2_5-8B")
    out = tmp_path / "internvl2_5-8b.yaml"
    assert cli.main(["import", "OpenGVLab/InternVL2_5-8B", "-o", str(out)]) == 0
    imported = api.load_spec(out)
    written = api.load_spec(ROOT / "specs" / "internvl" / "internvl2_5-8b.yaml")
    assert hf.modules(imported) == hf.modules(written)
    capsys.readouterr()
    assert (
        cli.main(
            [
                "estimate",
                "OpenGVLab/InternVL2_5-8B",
                "--micro-batch",
                "1",
                "--seq-len",
                "4096",
                "--image-size",
                "1024x768",
                "--trainable",
                "projector,language",
                "--format",
                "json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    by_spec = api.estimate(
        str(ROOT / "specs" / "internvl" / "internvl2_5-8b.yaml"), micro_batch=1, seq_len=4096, image_size=[1024, 768], trainable=["projector", "language"]
    )
    assert report["peak"]["allocated"] == by_spec.allocated


def test_crop_to_patches_bounds_its_search():
    from compiler.library.expr_python import FUNCTIONS, MAX_PATCHES

    crop = FUNCTIONS["crop_to_patches"]
    # 1024 high x 768 wide over 1 to 12 tiles of 448: 3 columns x 4 rows + the thumbnail
    assert crop(1024, 768, 448, 1, 12) == processor_tiles(1024, 768) == 13
    # at most 4 tiles: w / h = 0.75 is 0.25 from 1 x 1 (ratio 1), 1 x 2 (ratio 0.5) and 2 x 2
    # (ratio 1), a tie; a later grid of the tie wins while the area, 786,432, is over half the
    # grid's: 0.5 * 448^2 * 2 = 200,704 for 1 x 2, 0.5 * 448^2 * 4 = 401,408 for 2 x 2, so 2 x 2
    # and the thumbnail
    assert crop(1024, 768, 448, 1, 4) == 5 and processor_tiles(1024, 768) == 13
    for bad in ((1024, 768, 448, 0, 12), (1024, 768, 448, 5, 4), (1024, 768, 448, 1, MAX_PATCHES + 1), (0, 768, 448, 1, 12)):
        with pytest.raises(ValueError, match="crop_to_patches"):
            crop(*bad)
