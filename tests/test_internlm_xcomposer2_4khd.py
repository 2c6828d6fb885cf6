"""InternLM-XComposer2-4KHD-7B (the internlm_xcomposer2_4khd family): the import of the remote-code
checkpoint (a reconstructed config.json, see tests/hubfixtures.py IXC2_4KHD_7B), the HD grid and
positions per image at hd_num 25, the tower on each image's own crops, the merge and projection terms,
with the arithmetic. No measured record: there is no InternLM-XComposer2 class in transformers to trace.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "internlm_xcomposer2_4khd" / "internlm-xcomposer2-4khd-7b.yaml"
FIXTURE = hf.FIXTURES / "internlm-xcomposer2-4khd-7b"
TOKENS, HIDDEN, R = 4096, 4096, 256
LAYERS = "language.internlm2_layers[0:32]"
ROW = 4 * 1024 * 2  # one 2 x 2 merged feature, 4 x 1024 wide, bf16


def _positions(rows: int, cols: int) -> int:
    """build_mlp.py's temp_len: the global view's 144 + 12 sub_GN, glb_GN, the sub-images' rows x cols x 144 + rows x 12."""
    return (rows * cols + 1) * 144 + 1 + (rows + 1) * 12


def _est(**setup):
    return api.estimate(str(SPEC), **{"micro_batch": 1, "seq_len": TOKENS, "attention": "eager", "trainable": ["projector", "language"], **setup})


def _rows(**setup) -> dict:
    return {r.path: r for r in _est(**setup).rows}


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(FIXTURE))
    assert hf.modules(written) == hf.modules(imported.spec)
    # a square image (no --image-size) at hd_num 25: scale 5 (5 x ceil(5 / 1) = 25 <= 25), 5 x 5 crops
    assert written.image_tokens == _positions(5, 5) == 26 * 144 + 1 + 6 * 12 == 3817
    language = {m.name: m for m in written.modules}["language"].inputs
    assert (language["internlm2"], language["plora_r"], language["image_tokens"], language["hd_crops"]) == (True, R, 144, 25)
    # 8_678_766_592: tower 303_507_456 (577 positions), vision_proj 33_562_624 + separators 8192, language 8_341_688_320
    assert imported.header_parameters == {"vision": 303_507_456, "projector": 33_570_816, "language": 8_341_688_320}


@pytest.mark.parametrize(
    ("size", "grid"),
    [
        ((336, 336), (5, 5)),  # ratio 1: scale 5; 336 resized to 1680 x 1680, 5 x 5 crops
        # h x w 1008 x 672: taller, transposed; ratio 1.5: scale 6 (6 x ceil(4) = 24; 7 x 5 = 35 > 25),
        # the long side 6 x 336 = 2016, the short int(2016 / 1.5) = 1344 = 4 crops: 6 rows, 4 columns
        ((1008, 672), (6, 4)),
        # 1080 x 1920: ratio 1.777..: scale 6 (6 x ceil(3.375) = 24; 7 x ceil(3.94) = 28 > 25), the short
        # side int(2016 / 1.777..) = 1134, padded to ceil(1134 / 336) = 4 crops: 4 rows, 6 columns
        ((1080, 1920), (4, 6)),
        ((1920, 1080), (6, 4)),  # the same image on its side
    ],
)
def test_positions_and_tower_crops_follow_the_hd_grid(size, grid):
    rows, cols = grid
    est = _est(image_size=size)
    by_path = {r.path: r for r in est.rows}
    # 336 x 336: 3817; 1008 x 672 and 1920 x 1080: 25 x 144 + 1 + 7 x 12 = 3685; 1080 x 1920: 25 x 144 + 1 + 5 x 12 = 3661
    assert api.image_tokens_per_sample(est.nodes) == _positions(rows, cols) == {(5, 5): 3817, (6, 4): 3685, (4, 6): 3661}[grid]
    # the tower reads the global view and the image's own crops (no padding to hd_num + 1): the patch
    # conv's output [rows x cols + 1, 576, 1024] bf16
    assert by_path["vision.patch_embedding"].transient_forward == (rows * cols + 1) * 576 * 1024 * 2
    # vision_proj's first linear saves the concatenation [positions, 4096]
    assert by_path["projector.img_projection.linear_1"].activations == _positions(rows, cols) * ROW


def test_merge_and_projection_terms_of_a_square_image():
    rows = _rows()
    n = 3817
    projector = rows["projector"]
    # plora_glb_GN [1, 1, 4096] and plora_sub_GN [1, 1, 1, 4096], bf16
    assert projector.parameters == 2 * 4096 * 2
    # held through vision_proj: the tower's hidden_states[-1] 26 * 577 * 1024 * 2 = 30_724_096; the
    # global view's merged copy 144 rows and its sub_GN copy 12 * 13 = 156 rows; the sub-images'
    # sub_GN copy 5 * 12 * (5 * 12 + 1) = 3660 rows and merged copy 25 * 144 = 3600 rows
    assert projector.transient_forward == 26 * 577 * 1024 * 2 + (144 + 156 + 3660 + 3600) * ROW == 92_655_616
    # vision_proj (mlp2x_gelu 4096 -> 4096): .0 saves the concatenation, GELU its input, .2 GELU's output
    assert rows["projector.img_projection.linear_1"].activations == n * ROW
    assert rows["projector.img_projection.act"].activations == n * HIDDEN * 2
    assert rows["projector.img_projection.linear_2"].activations == n * HIDDEN * 2
    # 2 x (4096 * 4096 + 4096) = 33_562_624 parameters, bf16
    assert rows["projector.img_projection.linear_1"].parameters + rows["projector.img_projection.linear_2"].parameters == 33_562_624 * 2


def test_the_plora_branches_run_on_the_hd_positions():
    rows = _rows(image_size=(1080, 1920))
    image = 3661
    p = LAYERS + ".feed_forward_plora.w1"
    # dropout's bool mask and Plora_A's input over the 3661 image rows, Plora_B's input 3661 x 256, bf16
    assert rows[p + ".lora_dropout"].activations == image * HIDDEN
    assert rows[p + ".Plora_A"].activations == image * HIDDEN * 2
    assert rows[p + ".Plora_B"].activations == image * R * 2
    # three nonzero index sets of im_mask ([3661, 2] int64)
    assert rows[p].activations == 3 * image * 2 * 8


def test_the_language_model_is_xcomposer2_vl_s():
    vl = ROOT / "specs" / "internlm_xcomposer2" / "internlm-xcomposer2-vl-7b.yaml"
    setup = {"micro_batch": 1, "seq_len": TOKENS, "attention": "eager", "trainable": ["projector", "language"]}
    ours = {r.path: r for r in api.estimate(str(SPEC), **setup).rows}
    theirs = {r.path: r for r in api.estimate(str(vl), **setup).rows}
    # the same rows with the same parameters (the PLoRA InternLM2 of XComposer2-VL)
    language = {p: r.parameters for p, r in ours.items() if p.startswith("language")}
    assert language == {p: r.parameters for p, r in theirs.items() if p.startswith("language")}
    assert language[LAYERS + ".attention.wo_plora.base"] == HIDDEN * HIDDEN * 2


def test_an_image_whose_positions_outgrow_seq_len_is_refused():
    with pytest.raises(MemspecError) as info:
        _est(seq_len=2048)
    assert "3817" in str(info.value)


def test_family_lookup_sends_img_size_336_here_and_keeps_the_vl_release():
    assert importer.import_spec(str(FIXTURE)).spec.modules[1].type == "phi3v_hd_projector"
    assert importer.import_spec(str(hf.FIXTURES / "internlm-xcomposer2-vl-7b")).spec.modules[1].type == "mlp_projector"
