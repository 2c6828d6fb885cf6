"""Qwen-VL / Qwen-VL-Chat (the qwen_vl family): the import of the remote-code checkpoint, the terms
its tower, resampler, splice and language layers hold, with the arithmetic, and what it refuses.
No measured record: there is no Qwen-VL class in transformers to trace (see the family's notes)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "qwen_vl" / "qwen-vl-chat.yaml"
SEQ, HIDDEN, HEADS = 2048, 4096, 32
X = SEQ * HIDDEN * 2  # one [2048, 4096] bf16 tensor: 16_777_216
SCORES = HEADS * SEQ * SEQ * 2  # one [32, 2048, 2048] bf16 tensor: 268_435_456
PATCHES, WIDTH = 1024, 1664  # 448 / 14 = 32 x 32 patches
XV = PATCHES * WIDTH * 2  # one image's [1024, 1664] bf16 tensor in the tower: 3_407_872
LAYERS = "language.h[0:32]"
BLOCKS = "vision.resblocks[0:48]"
FIX_VIT = ["projector", "language"]  # finetune.py's --fix_vit
LORA = {"r": 64, "target_modules": ["c_attn", "attn.c_proj", "w1", "w2"]}  # finetune.py's defaults


def _rows(micro_batch: int = 1, trainable=FIX_VIT, **overrides) -> dict:
    est = api.estimate(str(SPEC), micro_batch=micro_batch, seq_len=SEQ, images_per_sample=1, trainable=trainable, **overrides)
    return {r.path: r for r in est.rows}


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(hf.FIXTURES / "Qwen-VL-Chat"))
    assert imported.family == "qwen_vl"
    assert hf.modules(written) == hf.modules(imported.spec)
    vision, projector, language = (m.inputs for m in written.modules)
    # int(1664 * 4.9231) = int(8192.04) = 8192; heads of the resampler 4096 // 128
    assert (vision["mlp"], projector["heads"], language["image_tokens"]) == (8192, 32, 256)
    assert written.attention == ("eager",) and written.image_tokens == 256


def test_a_config_without_visual_stays_in_the_qwen_family():
    # model_type "qwen" both: the `visual` block decides (vision type "visual", qwen/visual)
    assert importer.import_spec(str(hf.FIXTURES / "Qwen-7B")).family == "qwen"


def test_buffers_have_no_rotary_cache_and_no_logn_tensor():
    rows = _rows()
    # input_ids and labels 2 * 2048 * 8; the cos / sin cache stays on the host (inv_freq is a
    # plain attribute), so no rotary buffer
    assert rows["language"].buffers == 2 * SEQ * 8
    # masked_bias only: logn_tensor is a plain attribute of the revision, left on the host
    assert rows["language.h[1:32].attn"].buffers == 2


def test_the_language_attention_is_the_codes_own():
    rows = _rows()
    # torch.matmul's copies of the permuted q, k^T and v 3 * X, the 0-dim divisor's 512-byte block,
    # the bf16 probabilities [1, 32, 2048, 2048] (softmax's output, saved once for both users)
    assert rows[LAYERS + ".attn.core_vl"].activations == 3 * X + 512 + SCORES
    # the scores beside their quotient, before the probabilities exist
    assert rows[LAYERS + ".attn.core_vl"].transient_forward == SCORES
    # the softmax's backward: its gradient, the input gradient and CUDA's tmp, beside dv
    assert rows[LAYERS + ".attn.core_vl"].transient_backward == 3 * SCORES + X
    # no flash-attn in this revision: the torch rotary, at k: the rotated q and v's third, four fp32 copies
    assert rows[LAYERS + ".attn.rotary"].transient_forward == 2 * X + 4 * 2 * X
    # the locals keep c_attn's output and the rotated q and k (the kernel saved copies): 5 X
    assert rows["language.h[1:32].attn"].transient_forward == 5 * X


def test_cos_and_sin_are_one_device_copy_for_every_layer():
    rows = _rows()
    # the first layer's row carries cos and sin, fp32 [1, 2048, 1, 128] each, charged once; c_attn's
    # output is no saved tensor (the kernel saved copies of q, k and v)
    assert rows["language.h[0].attn"].activations == 2 * SEQ * 128 * 4
    assert not rows["language.h[1:32].attn"].activations


def test_checkpointed_layers_keep_the_mask_and_the_rope_once():
    rows = _rows(gradient_checkpointing=["language"])
    # the first layer's reentrant checkpoint: its input X, the [2048, 2048] bf16 mask (a tensor
    # argument of every layer, one storage) and cos / sin (the list kept in ctx.inputs)
    assert rows["language.h[0]"].activations == X + SEQ * SEQ * 2 + 2 * SEQ * 128 * 4
    assert rows["language.h[1:32]"].activations == X
    # the mask's making: two int64 aranges, the fp32 full, then the bf16 cast beside it (charged
    # by the layers from their checkpoint on), beside the held embeddings, ids and features
    held = X + SEQ * 8 + 256 * HIDDEN * 2 + 5 * 512
    assert rows["language.mask"].transient_forward == held + 2 * SEQ * 8 + SEQ * SEQ * 4 + SEQ * SEQ * 2


def test_the_splice_copies_the_embeddings():
    rows = _rows()
    images = 256 * HIDDEN * 2  # one image's features [256, 4096]: 2_097_152
    # held through the layers: the token embeddings (inputs_embeds), position_ids [1, 2048] int64,
    # the features and the image-position ids (bos_pos and eos_pos two tensors each, img_pos one)
    held = X + SEQ * 8 + images + 5 * 512
    # the copy (.clone()) beside what is held and the cos / sin copies, fp32 [1, 2048, 1, 128] each
    assert rows["language.splice"].transient_forward == X + held + 2 * SEQ * 128 * 4
    # the mask's making (two int64 aranges, the fp32 full and the bool comparison) beside it too
    assert rows["language.mask"].transient_forward == held + 2 * SEQ * 8 + SEQ * SEQ * 4 + SEQ * SEQ
    # CopySlices: the incoming gradient and its full copy, grad_slice.clone() and copy_'s two
    # gradients, then select_backward's zero-filled features beside their sum
    assert rows["language.splice"].transient_backward == 2 * X + 3 * images + 2 * images
    assert rows[LAYERS].transient_forward == X + held


def test_the_frozen_tower_saves_nothing():
    rows = _rows()
    assert rows[BLOCKS].activations == 0 and rows[BLOCKS + ".attn"].activations == 0
    # no gradient: the input, in_proj's output and q_scaled (5 x) stay in locals beside the scores
    # and the probabilities [16, 1024, 1024] bf16
    scores = 16 * PATCHES * PATCHES * 2
    assert rows[BLOCKS + ".attn"].transient_forward == 5 * XV + 2 * scores


def test_the_trained_tower_and_its_head():
    rows = _rows(trainable=["vision", "projector", "language"])
    scores = 16 * PATCHES * PATCHES * 2
    # in_proj's whole output (k's and v's views) 3 XV, q_scaled XV, the probabilities
    assert rows[BLOCKS + ".attn"].activations == 4 * XV + scores
    # no checkpointing in visual.py: asking for it changes nothing in the tower
    checkpointed = _rows(trainable=["vision", "projector", "language"], gradient_checkpointing=["vision"])
    assert checkpointed[BLOCKS + ".attn"].activations == rows[BLOCKS + ".attn"].activations
    # with the tower, ln_post and proj train (no --fix_vit); the sin-cos pos_embed never does
    assert rows["projector.proj"].gradients == 4096 * 4096 * 2
    assert rows["projector.pos_embed"].gradients == 0


def test_fix_vit_leaves_ln_post_and_proj_frozen():
    rows = _rows()
    assert rows["projector.ln_post"].gradients == 0 and rows["projector.proj"].gradients == 0
    # attn_pool trains: query 256 * 4096, ln_q 2 * 4096, in_proj 3 * 4096^2 + 3 * 4096, out_proj
    # 4096^2 + 4096 = 68_182_016, in bf16
    assert rows["projector.attn"].gradients == 68_182_016 * 2
    # its saved tensors, one image: ln_q's mean and rstd (fp32 [256], 1024 B each); the query input, q_scaled
    # and out_proj's input [256, 4096] 3 * 2_097_152; the key and value inputs' copies and their
    # projections [1024, 4096] 4 * 8_388_608; the probabilities [32, 256, 1024] bf16 16_777_216
    assert rows["projector.attn"].activations == 2 * 1024 + 3 * 2_097_152 + 4 * 8_388_608 + 16_777_216
    # kv_proj saves its reshaped copy of the tower's permuted output [1024, 1664]
    assert rows["projector.kv_proj"].activations == XV


def test_lora_on_qwen_vls_own_names():
    rows = _rows(trainable=[], lora=LORA, gradient_checkpointing=["language"])
    adapted = sorted(p for p, r in rows.items() if r.type == "lora_linear")
    # attn.c_proj matches the language layers' only (the tower's are out_proj and mlp.c_proj)
    assert adapted == [LAYERS + ".attn.c_attn", LAYERS + ".attn.c_proj", LAYERS + ".mlp.w1", LAYERS + ".mlp.w2"]
    # enable_input_require_grads (peft, checkpointing) hooks wte only: VisionTransformer is no
    # PreTrainedModel, so the frozen tower and resampler record nothing
    assert not any(r.activations for p, r in rows.items() if p.startswith(("vision", "projector")))
    # wte's output, a leaf that requires grad, kept until backward
    assert rows["language.wte"].activations == X


def test_other_attention_is_refused():
    for attention in ("sdpa", "flash_attention_2"):
        with pytest.raises(MemspecError) as info:
            _rows(attention=attention)
        assert [d.code for d in info.value.diagnostics] == ["E714"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"kv_channels": 64}, "kv_channels x num_attention_heads == hidden_size"),
        ({"rotary_pct": 0.5}, "partial rotary"),
        ({"emb_dropout_prob": 0.1}, "dropout"),
        ({"fp32": True}, "fp32 true"),
        ({"tie_word_embeddings": True}, "tied lm_head"),
        ({"visual": {**hf.QWEN_VL_CHAT["visual"], "output_dim": 2048}}, "output_dim == hidden_size"),
        ({"visual": {**hf.QWEN_VL_CHAT["visual"], "n_queries": 144}}, "n_queries other than 256"),
    ],
)
def test_variants_not_modelled_are_refused(tmp_path, change, words):
    folder = hf.edited_copy(hf.FIXTURES / "Qwen-VL-Chat", tmp_path / "Qwen-VL-Chat", lambda config: config.update(change))
    with pytest.raises(MemspecError) as info:
        importer.import_spec(folder)
    assert "E713" in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"tp": 2}, "E318"),  # remote code, no tensor split
        ({"loss": "fused_linear_cross_entropy"}, "E317"),  # the remote code's own cross-entropy
        ({"packing": True}, "E316"),  # images
        ({"activation_offloading": True}, "E316"),
    ],
)
def test_setups_not_modelled_for_qwen_vl_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        _rows(**override)
    assert code in [d.code for d in info.value.diagnostics]
