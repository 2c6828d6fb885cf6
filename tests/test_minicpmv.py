"""MiniCPM-V 2.6 (the minicpmv family): the import of the remote-code checkpoint, the terms its
tower, resampler, splice and language model hold, with the arithmetic, the processor's slicing of
a large image (the expression functions slice_count, slice_source and slice_cells against a
restatement of MiniCPMVImageProcessor.slice_image), and what it refuses.
No measured record: there is no MiniCPM-V 2.6 class in transformers to trace (see the family's notes)."""

from __future__ import annotations


import math

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from compiler.library.expr_python import FUNCTIONS, minicpmv_slicing
from compiler.pipeline.vocabulary import VisionChunk

SPEC = hf.ROOT / "specs" / "minicpmv" / "minicpm-v-2_6.yaml"
SEQ, HIDDEN, VISION = 2048, 3584, 1152
X = SEQ * HIDDEN * 2  # one [2048, 3584] bf16 tensor: 14_680_064
PATCHES = 32 * 32  # 448 x 448 unsliced: (448 / 14)^2 = 1024 patches
XV = PATCHES * VISION * 2  # one slice's [1024, 1152] bf16 tensor in the tower: 2_359_296
KV = PATCHES * HIDDEN * 2  # one slice's keys [1024, 3584] bf16 in the resampler: 7_340_032
Q = 64 * HIDDEN * 2  # one slice's queries / features [64, 3584] bf16: 458_752
TRAIN = ["projector", "language"]  # finetune.py without --tune_vision (the resampler always trains)


def _rows(micro_batch: int = 1, trainable=TRAIN, **overrides) -> dict:
    overrides.setdefault("attention", "flash_attention_2")
    est = api.estimate(str(SPEC), micro_batch=micro_batch, seq_len=SEQ, images_per_sample=1, trainable=trainable, **overrides)
    return {r.path: r for r in est.rows}


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(hf.FIXTURES / "MiniCPM-V-2_6"))
    assert imported.family == "minicpmv"
    assert hf.modules(written) == hf.modules(imported.spec)
    vision, projector, language = (m.inputs for m in written.modules)
    # the 980 px position table (70 x 70), the resampler's 3584 // 128 heads, 64 queries per image
    assert (vision["image_size"], projector["heads"], language["image_tokens"]) == (980, 28, 64)
    assert written.attention == ("sdpa", "eager", "flash_attention_2") and written.image_tokens == 64
    # the processor's slicing (scale_resolution 448, max_slice_nums 9) and the tower's chunk of 16 slices
    assert written.vision_chunk == VisionChunk(scale=448, max_slices=9, slices=16)


def test_the_tower_reads_one_row_of_patches_per_slice():
    rows = _rows()
    # the fp32 slice [3, 14, 14 x 1024]: 1024 * 588 * 4 B
    assert rows["vision"].buffers == PATCHES * 588 * 4
    # frozen: the 16-bit copy the tower reads (all_pixel_values.to(dtype)) alive through it
    assert rows["vision"].transient_forward == PATCHES * 588 * 2
    # the lookup and the sum [1024, 1152] beside the one device copy of the position ids [1, 1024] int64
    assert rows["vision.position_embedding"].transient_forward == 2 * XV + PATCHES * 8
    # the table's 4900 rows are parameters: 4900 * 1152 * 2 B
    assert rows["vision.position_embedding"].parameters == 4900 * VISION * 2
    # a 300 x 600 image: find_best_resize to int(448 / sqrt(2)) = 316 x int(316 * 2) = 632, rounded to
    # 14: 23 x 45 = 1035 patches
    assert _rows(image_size=(300, 600))["vision"].buffers == 1035 * 588 * 4


def test_the_trained_tower_saves_its_input_copy_and_the_ids():
    rows = _rows(trainable=["vision", "projector", "language"], gradient_checkpointing=["vision", "language"])
    # the conv saves the 16-bit copy of the pixels (the model's own, not the batch's fp32 slices)
    assert rows["vision.patch_embedding"].activations == PATCHES * 588 * 2
    # the position ids [1, 1024] int64 for the table's gradient
    assert rows["vision.position_embedding"].activations == PATCHES * 8
    # each checkpointed layer keeps its input
    assert rows["vision.layers[0:27]"].activations == XV


def test_the_resampler():
    rows = _rows()
    # the fp32 70 x 70 x 3584 sin-cos table, a non-persistent buffer
    assert rows["projector"].buffers == 70 * 70 * HIDDEN * 4
    # kv_proj saves the tower's own contiguous output [1024, 1152]
    assert rows["projector.kv_proj"].activations == XV
    # ln_q's mean and rstd (two 512-byte blocks), the query input (the _repeat), q_scaled and
    # out_proj's input 3 Q; the key and value inputs and their projections 4 KV; the
    # probabilities [28, 64, 1024] bf16
    assert rows["projector.attn"].activations == 2 * 512 + 3 * Q + 4 * KV + 28 * 64 * PATCHES * 2
    # ln_q's output and the slices' positions [1024, 1, 3584], the float key-padding mask [1, 1024]
    # and its [28, 1, 1024] copy, the key input and the q projection, then the probabilities
    base = Q + KV + PATCHES * (1 + 28) * 2
    assert rows["projector.attn"].transient_forward == base + KV + Q + 28 * 64 * PATCHES * 2


def test_the_features_are_scattered_in_place():
    rows = _rows()
    # scatter_'s saved index: image_indices.view(-1, 1).repeat(1, 3584), int64 [64, 3584]
    assert rows["language.image_merge[0]"].activations == 64 * HIDDEN * 8
    # in place: nothing new in the forward
    assert rows["language.image_merge[0]"].transient_forward == 0
    # CopySlices: the embeddings' gradient cloned, the row cloned and scattered with zeros, the
    # gathered features' gradient, and SliceBackward's zero-filled features
    assert rows["language.image_merge[0]"].transient_backward == X + 2 * X + Q + Q
    # two samples: each one's index, and the per-sample slices' gradients summed into a second buffer
    two = _rows(micro_batch=2)
    assert two["language.image_merge[0]"].activations == 2 * 64 * HIDDEN * 8
    assert two["language.image_merge[0]"].transient_backward == 2 * X + 2 * X + Q + 2 * Q + 2 * Q


def test_the_batch_brings_its_position_ids():
    rows = _rows()
    # input_ids and labels 2 * 2048 * 8; position_ids [1, 2048] int64 from the batch (MiniCPMV.forward)
    assert rows["language"].buffers == 2 * SEQ * 8
    assert rows["language.batch_inputs[0]"].buffers == SEQ * 8


def test_lora_with_checkpointing_hooks_the_towers_patch_conv():
    # finetune.py's LoRA: the language model's attention projections, embed_tokens and the resampler saved
    lora = {"r": 64, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "modules_to_save": ["embed_tokens"]}
    rows = _rows(trainable=["projector"], lora=lora, gradient_checkpointing=["language"])
    # the trained copy of embed_tokens: 151666 x 3584 in bf16
    assert rows["language.embed_tokens.modules_to_save"].gradients == 151666 * HIDDEN * 2
    adapted = sorted(p for p, r in rows.items() if r.type == "lora_linear")
    layers = "language.layers[0:28].self_attn."
    # peft adapts the language model's attention projections (finetune.py's target, llm..layers.N.self_attn)
    assert adapted == [layers + "k_proj", layers + "o_proj", layers + "q_proj", layers + "v_proj"]
    # enable_input_require_grads hooks every PreTrainedModel submodule's input embeddings: vpm's
    # patch conv too, whose output [1024, 1152] is then a leaf the graph keeps, and the frozen
    # layers record autograd (each layer_norm1 saves its input and fp32 mean and rstd)
    assert rows["vision.patch_embedding"].activations == XV
    assert rows["vision.layers[0:27].layer_norm1"].activations == XV + 2 * PATCHES * 4
    # without peft nothing is hooked: the frozen tower saves nothing
    assert not any(r.activations for p, r in _rows().items() if p.startswith("vision"))


def test_the_tower_runs_eager_unless_flash_attention_2():
    trained = ["vision", "projector", "language"]
    core, lang = "vision.layers[0:27].self_attn.core", "language.layers[0:28].self_attn.core"
    scores = 16 * PATCHES * PATCHES  # [16 heads, 1024, 1024] per slice
    sdpa, eager, flash = (_rows(trainable=trained, attention=a) for a in ("sdpa", "eager", "flash_attention_2"))
    # under sdpa (and eager) the tower's own eager attention: q, k and v [16, 1024, 72] 3 XV, the fp32
    # softmax output and its bf16 cast
    assert sdpa[core].activations == eager[core].activations == 3 * XV + scores * (4 + 2)
    # at the softmax, scores x fp32 on top
    assert sdpa[core].transient_forward == scores * 4 + XV
    # flash_attention_2 reaches the tower: q, k, v, the output, fp32 [16, 1024] log-sum-exp and the
    # philox seed and offset
    assert flash[core].activations == 4 * XV + 16 * PATCHES * 4 + 2 * 8 + 8
    # the language model follows the experiment: sdpa without a mask is the flash kernel
    assert sdpa[lang].activations == flash[lang].activations < eager[lang].activations


def _grid_26(height: int, width: int, scale: int = 448, max_slices: int = 9):
    """MiniCPMVImageProcessor.get_sliced_grid (openbmb/MiniCPM-V-2_6 image_processing_minicpmv.py),
    restated in its own order: [columns, rows] for m = 1 .. n of each candidate count, the first of
    the least error kept; as (rows, columns), or None."""
    log_ratio = math.log(width / height)
    multiple = min(math.ceil(width * height / (scale * scale)), max_slices)
    if multiple <= 1:
        return None
    grids = [[m, n // m] for n in (multiple - 1, multiple, multiple + 1) if n != 1 and n <= max_slices for m in range(1, n + 1) if n % m == 0]
    best, least = [1, 1], float("inf")
    for grid in grids:
        error = abs(log_ratio - math.log(grid[0] / grid[1]))
        if error < least:
            best, least = grid, error
    return best[1], best[0]


@pytest.mark.parametrize(
    ("size", "source", "grid", "piece"),
    [
        # 448 x 448: ceil(448^2 / 448^2) = 1, not sliced; resized to itself, 32 x 32 patches
        ((448, 448), (448, 448), None, None),
        # 1344 x 896 (h x w): ceil(6.0) = 6 slices of 5, 6, 7; log(896 / 1344) = log(2 / 3) is 3 rows x 2
        # columns exactly; the source int(448 / sqrt(2 / 3)) = 548 x int(548 x 2 / 3) = 365, rounded to 14:
        # 546 x 364 (39 x 26 = 1,014 patches); a slice 1344 / 3 x 896 / 2 = 448 x 448 (1,024 patches)
        ((1344, 896), (546, 364), (3, 2), (448, 448)),
        # 1024 x 768: ceil(3.92) = 4; log(0.75) is nearest log(1) (2 x 2); the source int(448 / sqrt(0.75)) =
        # 517 x int(517 x 0.75) = 387 -> 518 x 392 (37 x 28 = 1,036 patches); a slice 512 x 384, resized alike
        ((1024, 768), (518, 392), (2, 2), (518, 392)),
        # 2000 x 500: ceil(4.98) = 5; log(1 / 4) is 4 rows x 1 column exactly; the source 896 x 224
        # (64 x 16 = 1,024 patches); a slice 500 x 500 -> 448 x 448
        ((2000, 500), (896, 224), (4, 1), (448, 448)),
    ],
)
def test_the_processors_slicing(size, source, grid, piece):
    h, w = size
    assert minicpmv_slicing(h, w, 448, 14, 9) == (source, grid or (0, 0), piece)
    assert _grid_26(h, w) == grid
    assert FUNCTIONS["slice_count"](h, w, 448, 9) == (grid[0] * grid[1] if grid else 0)
    assert FUNCTIONS["slice_source"](h, w, 448, 14) == source[0] // 14 * (source[1] // 14)
    assert FUNCTIONS["slice_cells"](h, w, 448, 14, 9) == (piece[0] // 14 * (piece[1] // 14) if piece else 0)


def test_the_grid_search_is_the_26_processors_order():
    """The function breaks an exact tie towards more rows (MiniCPM-V 4.6's rule); 2.6 keeps the first
    of its [columns, rows] order: the same grid at every size here (ties occur within one slice count
    only, where its first is the one of most rows), square images included."""
    sizes = [(h, w) for h in range(100, 4001, 37) for w in range(100, 4001, 41)] + [(s, s) for s in range(449, 3000, 7)]
    for h, w in sizes:
        for max_slices in (2, 4, 9):
            expected = _grid_26(h, w, 448, max_slices)
            assert FUNCTIONS["slice_count"](h, w, 448, max_slices) == (expected[0] * expected[1] if expected else 0), (h, w, max_slices)
    with pytest.raises(ValueError, match="slice_count"):
        FUNCTIONS["slice_count"](448, 448, 448, 65)


def test_a_sliced_image_is_its_source_image_and_slices():
    flat, sliced = _rows(attention="sdpa"), _rows(attention="sdpa", image_size=(1344, 896))
    # 1 + 3 x 2 slices, padded to the longest, 1,024 patches (the source image's 1,014 padded):
    # the fp32 pixels [7, 3, 14, 14 x 1024] and every row of the tower 7 x as large
    assert sliced["vision"].buffers == 7 * PATCHES * 588 * 4 == 7 * flat["vision"].buffers
    assert sliced["projector.kv_proj"].activations == 7 * XV
    # padded: the eager tower's additive mask [7, 1, 1024, 1024] bf16 alive through it, beside the
    # 16-bit copy of the pixels
    assert sliced["vision"].transient_forward == 7 * PATCHES * 588 * 2 + 7 * PATCHES * PATCHES * 2
    # 2000 x 500: the source image and its 4 slices have 1,024 patches each, nothing padded, no mask
    assert _rows(attention="sdpa", image_size=(2000, 500))["vision"].transient_forward == 5 * PATCHES * 588 * 2
    # the language model: 64 features per piece, 7 x 64 = 448 image positions scattered
    assert sliced["language.image_merge[0]"].activations == 448 * HIDDEN * 8
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=SEQ, images_per_sample=1, trainable=TRAIN, image_size=[1344, 896])
    assert api.image_tokens_per_sample(est.nodes) == 448
    base = api.estimate(str(SPEC), micro_batch=1, seq_len=SEQ, images_per_sample=1, trainable=TRAIN)
    assert est.allocated > base.allocated


def test_more_slices_than_the_tower_runs_at_once_are_refused():
    # 2 x 7 = 14 slices of 1344 x 896 fit vision_batch_size 16; 3 x 7 = 21 do not (E725)
    _rows(micro_batch=2, image_size=(1344, 896))
    with pytest.raises(MemspecError) as info:
        _rows(micro_batch=3, image_size=(1344, 896))
    (d,) = info.value.diagnostics
    assert d.code == "E725" and "at most 16 slices at once" in d.message and "21" in d.message and "its source image and 6 slices" in d.message
    # 17 unsliced 448 x 448 images: 17 slices
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), micro_batch=17, seq_len=SEQ, images_per_sample=1, trainable=TRAIN, attention="flash_attention_2")
    assert [d.code for d in info.value.diagnostics] == ["E725"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"version": 2.5}, "only MiniCPM-V 2.6"),
        ({"drop_vision_last_layer": True}, "drop_vision_last_layer"),
        ({"tie_word_embeddings": True}, "tied lm_head"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_variants_not_modelled_are_refused(tmp_path, change, words):
    folder = hf.edited_copy(hf.FIXTURES / "MiniCPM-V-2_6", tmp_path / "MiniCPM-V-2_6", lambda config: config.update(change))
    with pytest.raises(MemspecError) as info:
        importer.import_spec(folder)
    assert "E713" in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"tp": 2}, "E318"),  # remote code, no tensor split
        ({"loss": "fused_linear_cross_entropy"}, "E317"),
        ({"packing": True}, "E316"),
        ({"activation_offloading": True}, "E316"),
    ],
)
def test_setups_not_modelled_for_minicpmv_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        _rows(**override)
    assert code in [d.code for d in info.value.diagnostics]


def test_fit_stops_the_micro_batch_at_the_slices_the_tower_runs_at_once():
    """A 1344 x 896 image is its source and a 3 x 2 grid: 7 pieces, so vision_batch_size 16
    holds two samples' slices (14) and not three (21, refused E725). fit's micro-batch search
    ends there and says why, where it stopped with E404 on the spec's -1 sequence past it."""
    from compiler.commands.fit import fit
    from compiler.pipeline import render
    from compiler.pipeline.resolve import gpu_catalog, parse_margin

    spec, setup = api.load_inputs(
        str(SPEC),
        {"micro_batch": 1, "image_size": [1344, 896], "seq_len": 2048, "trainable": ["projector"], "lora": {"r": 16}, "gradient_checkpointing": ["language"]},
    )
    f = fit(spec, setup, gpu_catalog()[0]["h100-80gb"], margin=parse_margin("4%"))
    assert f.micro_batch_bound == 2 and f.micro_batch.value == 2 and f.micro_batch.next_value is None
    assert "the most samples whose image slices the tower runs at once" in render.fit_text(f)
