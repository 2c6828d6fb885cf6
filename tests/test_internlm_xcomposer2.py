"""InternLM-XComposer2-VL-7B (the internlm_xcomposer2 family): the import of the remote-code
checkpoint and the terms Partial LoRA and the torch.cat merge add to InternLM2's, with the arithmetic.
No measured record: there is no InternLM-XComposer2 class in transformers to trace (see the family's notes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "internlm_xcomposer2" / "internlm-xcomposer2-vl-7b.yaml"
FIXTURE = hf.FIXTURES / "internlm-xcomposer2-vl-7b"
TOKENS, HIDDEN, INTER, IMAGE = 2048, 4096, 14336, 1225  # one 490 px image: (490 // 14)^2 patches
R = 256  # PLoRA's lora_r in modeling_internlm2.py
LAYERS = "language.internlm2_layers[0:32]"


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(FIXTURE)).spec
    assert hf.modules(written) == hf.modules(imported)
    assert written.image_tokens == IMAGE
    language = {m.name: m for m in written.modules}["language"].inputs
    assert (language["internlm2"], language["plora_r"], language["image_tokens"]) == (True, R, IMAGE)


def _rows(**setup) -> dict:
    est = api.estimate(str(SPEC), **{"micro_batch": 1, "seq_len": TOKENS, "attention": "eager", **setup})
    return {r.path: r for r in est.rows}


def test_every_linear_of_the_layers_is_a_plora_linear():
    rows = _rows()
    for name, d_in, d_out in (
        ("attention.wqkv_plora", HIDDEN, 6144),  # (32 + 2 * 8) * 128
        ("attention.wo_plora", HIDDEN, HIDDEN),
        ("feed_forward_plora.w1", HIDDEN, INTER),
        ("feed_forward_plora.w3", HIDDEN, INTER),
        ("feed_forward_plora.w2", INTER, HIDDEN),
    ):
        p = f"{LAYERS}.{name}"
        assert rows[p + ".base"].parameters == d_out * d_in * 2
        assert rows[p + ".Plora_A"].parameters == R * d_in * 2
        assert rows[p + ".Plora_B"].parameters == d_out * R * 2
        # the branch on the image rows only: dropout's bool mask, Plora_A's input (the dropped-out
        # rows, bf16) and Plora_B's (A's output, 1225 x 256 bf16)
        assert rows[p + ".lora_dropout"].activations == IMAGE * d_in
        assert rows[p + ".Plora_A"].activations == IMAGE * d_in * 2
        assert rows[p + ".Plora_B"].activations == IMAGE * R * 2
        # three nonzero index sets of the bool mask ([1225, 2] int64): x[im_mask], res[im_mask], the write back
        assert rows[p].activations == 3 * IMAGE * 2 * 8
    assert not any(".attention.wqkv" in p and "plora" not in p for p in rows)
    assert not any(p.startswith(LAYERS + ".feed_forward.") for p in rows)


def test_the_plora_transients():
    rows = _rows()
    w1 = rows[LAYERS + ".feed_forward_plora.w1"]
    # forward: res [2048, 14336] + part_x [1225, 4096] + the scaled branch output [1225, 14336], bf16
    assert w1.transient_forward == (TOKENS * INTER + IMAGE * HIDDEN + IMAGE * INTER) * 2
    # backward: two gradients of res (index_put_'s clone, the read's zero-filled one) + x's zero-filled gradient
    assert w1.transient_backward == (2 * TOKENS * INTER + TOKENS * HIDDEN) * 2


def test_the_older_internlm2_code_slices_its_rotary_cache_and_runs_eager():
    rows = _rows()
    # cos_cached[:s] and sin_cached[:s], expanded over the batch: the products save views of the
    # layer's cache (its buffers, [32768, 128] bf16 each, + inv_freq [64] fp32), nothing new
    assert rows[LAYERS + ".attention.rotary"].activations == 0
    assert rows[LAYERS + ".attention"].buffers == 2 * 32768 * 128 * 2 + 64 * 4
    # eager, grouped heads (32 / 8): repeat_kv copies k and v, so no view keeps the wqkv output
    assert rows[LAYERS + ".attention"].activations == 0
    # the [1, 1, 2048, 2048] additive mask the remote InternLM2Model always builds, bf16
    assert rows["language"].transient_forward == TOKENS * TOKENS * 2


@pytest.mark.parametrize("attention", ["sdpa", "flash_attention_2"])
def test_only_eager_attention_is_modelled(attention):
    with pytest.raises(MemspecError):
        api.estimate(str(SPEC), micro_batch=1, seq_len=TOKENS, attention=attention)


def test_the_images_join_the_text_by_concatenation():
    rows = _rows()
    merge = rows["language.image_merge[0]"]
    # torch.cat saves nothing: no mask, no features kept by an output
    assert merge.activations == 0
    # the features [1225, 4096] and the joined embeddings [2048, 4096], bf16
    assert merge.transient_forward == (IMAGE + TOKENS) * HIDDEN * 2
    assert merge.transient_backward == TOKENS * HIDDEN * 2


def test_a_text_only_batch_runs_the_branch_on_position_zero():
    rows = _rows(images_per_sample=0)
    p = LAYERS + ".feed_forward_plora.w1"
    # x[:, :1] and res[:, :1] are slices: no indices; one row per sample through the branch
    assert rows[p].activations == 0
    assert rows[p + ".lora_dropout"].activations == HIDDEN
    assert rows[p + ".Plora_A"].activations == HIDDEN * 2


def test_the_plora_weights_train_with_the_language_model_and_the_tower_can_freeze():
    # finetune.py's default fix_vit True: the tower frozen, vision_proj and the language model trained
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=TOKENS, attention="eager", trainable=["projector", "language"])
    rows = {r.path: r for r in est.rows}
    assert rows[LAYERS + ".feed_forward_plora.w1.Plora_A"].gradients == R * HIDDEN * 2
    assert all(r.gradients == 0 for r in est.rows if r.path.startswith("vision"))


def test_the_released_finetune_sh_trains_the_tower_too():
    # --fix_vit False --gradient_checkpointing True (the tower's encoder checkpointed as well)
    est = api.estimate(
        str(SPEC),
        micro_batch=1,
        seq_len=TOKENS,
        attention="eager",
        trainable=["vision", "projector", "language"],
        gradient_checkpointing=["vision", "language"],
    )
    # every trained parameter but the tower's post_layernorm (2 x 1024, past hidden_states[-1]):
    # 8_666_840_064 - 2048, bf16 gradients (each row counts one of its `count` instances)
    assert sum((r.gradients or 0) * r.count for r in est.rows) == (8_666_840_064 - 2048) * 2


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"tp": 2}, "E318"),  # the fused wqkv is not split by tp
        ({"loss": "fused_linear_cross_entropy"}, "E317"),  # the remote code's own cross-entropy
        ({"packing": True}, "E316"),  # its layers build their own masks
        ({"activation_offloading": True}, "E316"),
    ],
)
def test_setups_not_modelled_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), micro_batch=1, seq_len=TOKENS, **override)
    assert code in [d.code for d in info.value.diagnostics]


@pytest.mark.parametrize("img_size", [224, 560])  # internlm-xcomposer2-7b, xcomposer2d5 (336, -4khd-7b: tests/test_internlm_xcomposer2_4khd.py)
def test_other_releases_are_refused(tmp_path, img_size):
    message = hf.refusal(FIXTURE, tmp_path / "copy", "", "img_size", img_size)
    assert "only InternLM-XComposer2-VL-7B is modelled" in message


def test_checkpointed_layers_keep_what_internlm2_keeps_and_im_mask_is_a_step_buffer():
    setup = {"micro_batch": 1, "seq_len": TOKENS, "attention": "eager", "gradient_checkpointing": ["language"]}
    ixc2 = {r.path: r for r in api.estimate(str(SPEC), trainable=["projector", "language"], **setup).rows}
    text = {r.path: r for r in api.estimate(str(ROOT / "specs" / "internlm2" / "internlm2_5-7b-chat.yaml"), **setup).rows}
    # layer 0: its input, position_ids [1, 2048] int64, the [1, 1, 2048, 2048] bf16 mask; the others their input
    for path in (LAYERS.replace("[0:32]", "[0]"), LAYERS.replace("[0:32]", "[1:32]")):
        assert ixc2[path].activations == text[path].activations
    assert ixc2[LAYERS.replace("[0:32]", "[0]")].activations == TOKENS * HIDDEN * 2 + TOKENS * 8 + TOKENS * TOKENS * 2
    # im_mask [1, 2048] bool beside input_ids and labels (int64 each), resident for the step
    assert ixc2["language"].buffers == 2 * TOKENS * 8 + TOKENS
