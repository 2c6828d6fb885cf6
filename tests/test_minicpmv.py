"""MiniCPM-V 2.6 (the minicpmv family): the import of the remote-code checkpoint, the terms its
tower, resampler, splice and language model hold, with the arithmetic, and what it refuses.
No measured record: there is no MiniCPM-V 2.6 class in transformers to trace (see the family's notes)."""

from __future__ import annotations


import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

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
    # 448^2 pixels: a larger image is sliced (refused, E725)
    assert written.image_slice_pixels == 448 * 448


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


def test_sliced_images_and_chunked_towers_are_refused():
    # 449 x 448 pixels > 448^2: the processor slices it
    with pytest.raises(MemspecError) as info:
        _rows(image_size=(449, 448))
    assert [d.code for d in info.value.diagnostics] == ["E725"]
    # 17 slices > vision_batch_size 16: the tower runs in chunks (the seq expression gives -1)
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), micro_batch=17, seq_len=SEQ, images_per_sample=1, trainable=TRAIN, attention="flash_attention_2")
    assert "E404" in [d.code for d in info.value.diagnostics]


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
