"""Baichuan2-7B as a text-only model (the baichuan family): the import of the remote-code
checkpoint, the terms its layers, head and loss hold beyond Llama's, with the arithmetic, and the
variants and setups the formulas do not model. No measured record: there is no Baichuan class in
transformers to trace (see the family's notes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "baichuan" / "baichuan2-7b-base.yaml"
FIXTURE = hf.FIXTURES / "Baichuan2-7B-Base"
B, S, HIDDEN, VOCAB = 2, 2048, 4096, 125696
TOKENS = B * S
X = TOKENS * HIDDEN * 2  # one bf16 [b, s, hidden] tensor: 33_554_432
LAYERS = "language.layers[0:32]"


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(FIXTURE)).spec
    assert hf.modules(written) == hf.modules(imported)
    language = written.modules[0].inputs
    assert (language["positions"], language["vocab"], language["head_dim"]) == (4096, VOCAB, 128)
    assert list(written.attention) == ["sdpa"]


def _rows(**overrides) -> dict:
    est = api.estimate(str(SPEC), micro_batch=B, seq_len=S, **overrides)
    return {r.path: r for r in est.rows}


def test_attention_terms():
    rows = _rows()
    # W_pack [3 * 4096, 4096] and o_proj [4096, 4096], bf16
    assert rows[LAYERS + ".self_attn.W_pack"].parameters == 3 * 4096 * 4096 * 2
    assert rows[LAYERS + ".self_attn.o_proj"].parameters == 4096 * 4096 * 2
    rotary0, rotary = rows["language.layers[0].self_attn.rotary"], rows["language.layers[1:32].self_attn.rotary"]
    # every layer's own cos_cached and sin_cached [1, 1, 4096, 128], fp32 whatever the load dtype
    assert rotary.buffers == 2 * 4096 * 128 * 4
    # cos[position_ids], sin[position_ids] fp32 [1, 1, s, 128] + W_pack's q and k thirds, kept by the
    # kernel's saved view v: 4 * 2048 * 128 * 2 + 2 * X
    assert rotary.activations == 2 * S * 128 * 4 + 2 * X
    # the first layer's kernel also saves the model's additive mask [2, 1, 2048, 2048] bf16, one for all layers
    assert rotary0.activations - rotary.activations == B * S * S * 2
    # the fp32 rotary: at k's cat, q's fp32 result, k.float() * cos, k.float(), -x2, the cat: 4.5 fp32 q's
    assert rotary.transient_forward == 4 * 2 * X + X
    # k's rotary backward: 4.5 fp32 q-sized tensors beside q's and v's pending bf16 gradients, which
    # take the place of W_pack's output (qkv_rest, charged until then, freed with the kernel's v)
    assert rotary.transient_backward == 4 * 2 * X + X
    # the memory-efficient kernel (a float mask rules flash out): q, k, v, out + lse padded to 32 rows
    # (2 * 32 * 2048 * 4) + philox seed and offset (2 * 8); the mask is charged by the rotary's row
    assert rows[LAYERS + ".self_attn.core"].activations == 4 * X + B * 32 * S * 4 + 2 * 8


def test_norms_save_the_16_bit_input_too():
    rows = _rows()
    norm = rows[LAYERS + ".input_layernorm"]
    # x.to(float32) (saved by pow) + the 16-bit input (saved by the multiply) + rsqrt [b, s, 1] fp32
    # + the normed cast (saved by the weight's multiply): 2 X + X + 4096 * 4 + X
    assert norm.activations == 4 * X + TOKENS * 4
    # Llama's RMSNorm keeps the fp32 copy, rstd and the cast only: one X less per norm
    llama = {r.path: r for r in api.estimate(str(ROOT / "specs" / "llama" / "llama-2-7b.yaml"), micro_batch=B, seq_len=S).rows}
    assert norm.activations - llama["language.layers[0:32].input_layernorm"].activations == X
    # backward: three fp32 x and one bf16 x on top of the saved tensors (traced: the final norm's moment)
    assert norm.transient_backward == 3 * 2 * X + X


def test_norm_head_keeps_a_normalised_copy_of_the_head():
    head = _rows()["language.lm_head"]
    w = VOCAB * HIDDEN * 2  # 1_029_701_632
    assert head.parameters == w
    # x (the final norm's output) + F.normalize(W), which F.linear saves for dX + the row norms [V, 1] twice
    assert head.activations == X + w + 2 * VOCAB * 2
    # DivBackward0: dWn, the divisor's gradient's four [V, h] temporaries and dX waiting (5 w + X) while
    # x, the normalised copy and W.grad (charged from the head's backward on) are not: 3 w on top
    assert head.transient_backward == 3 * w
    lora = {r.path: r for r in api.estimate(str(SPEC), micro_batch=B, seq_len=S, trainable=[], lora={"r": 16, "target_modules": ["W_pack"]}).rows}
    frozen = lora["language.lm_head"]
    # frozen head: the normalised copy is still made and saved for dX (the LoRA'd layers need it)
    assert frozen.activations == w
    assert frozen.transient_backward == TOKENS * VOCAB * 2 + X


def test_loss_in_the_compute_dtype_with_the_z_loss():
    loss = _rows()["language.loss"]
    shift = B * (S - 1) * VOCAB * 2  # 1_029_198_592, a multiple of 512
    logits = TOKENS * VOCAB * 2
    # bf16 log-probs over s - 1 positions + labels[..., 1:] copy [2, 2047] int64 (32_752 -> 32_768)
    # + the max's indices (int64, 32_768) and maxima (bf16, 8_188 -> 8_192) + total_weight, the loss and
    # its seed gradient, bf16 scalars
    assert loss.activations == shift + 32_768 + 32_768 + 8_192 + 3 * 2
    # the logits the model returns beside their shifted contiguous copy (a copy at batch 2), the
    # normalizer [2 * 2047] bf16 (8_188 -> 8_192) and two 0-dim tensors (z_loss, the cross-entropy)
    assert loss.transient_forward == logits + shift + 8_192 + 2 * 512
    # nll_loss's and log_softmax's gradients beside the saved log-probabilities
    assert loss.transient_backward == 2 * shift
    one = {r.path: r for r in api.estimate(str(SPEC), micro_batch=1, seq_len=S).rows}["language.loss"]
    # one sample: logits[..., :-1, :] is contiguous already, so .contiguous() copies nothing
    assert one.transient_forward == S * VOCAB * 2 + 4_096 + 2 * 512


def test_checkpointed_layers_keep_the_mask():
    rows = _rows(gradient_checkpointing=["language"])
    # the layer input X + position_ids [1, 2048] int64 + the additive mask [2, 1, 2048, 2048] bf16
    assert rows["language.layers[0]"].activations == X + S * 8 + B * S * S * 2
    assert rows["language.layers[1:32]"].activations == X


def test_lora_with_checkpointing_charges_the_embeddings_once():
    rows = _rows(trainable=[], lora={"r": 16, "target_modules": ["W_pack"]}, gradient_checkpointing=["language"])
    # peft's input-grad hook makes the frozen embeddings' output require grad; the first
    # checkpointed layer saves it as its input (with position_ids and the mask), not the embedding too
    assert rows["language.embed_tokens"].activations == 0
    assert rows["language.layers[0]"].activations == X + S * 8 + B * S * S * 2
    # LoRA adapts W_pack by the name the checkpoint and peft's target_modules use
    assert rows[LAYERS + ".self_attn.W_pack"].type == "lora_linear"


def test_a_sequence_past_the_cache_rebuilds_it_in_fp32():
    rows = {r.path: r for r in api.estimate(str(SPEC), micro_batch=1, seq_len=8192).rows}
    assert rows["language.layers[1:32].self_attn.rotary"].buffers == 2 * 8192 * 128 * 4


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"attention": "eager"}, "E714"),  # the remote code has no eager path without xformers
        ({"attention": "flash_attention_2"}, "E714"),  # nor a flash one: its float mask rules flash out
        ({"tp": 2}, "E318"),  # W_pack is not split by tp
        ({"loss": "fused_linear_cross_entropy"}, "E317"),  # the remote code's own cross-entropy and NormHead
        ({"packing": True}, "E316"),  # the model builds its own mask
        ({"activation_offloading": True}, "E316"),
    ],
)
def test_setups_not_modelled_for_baichuan_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), micro_batch=1, seq_len=S, **override)
    assert code in [d.code for d in info.value.diagnostics]


def test_baichuan_7b_is_refused(tmp_path):
    # Baichuan-7B's remote code (BaiChuanForCausalLM) imports xformers unconditionally
    message = hf.refusal(FIXTURE, tmp_path / "v1", "", "architectures", ["BaiChuanForCausalLM"])
    assert "E713" in message and "xformers" in message


def test_the_alibi_13b_checkpoints_are_refused(tmp_path):
    def edit(data):
        data.update(hidden_size=5120, intermediate_size=13696, num_attention_heads=40, num_hidden_layers=40)
        del data["max_position_embeddings"]

    with pytest.raises(MemspecError) as info:
        importer.import_spec(hf.edited_copy(FIXTURE, tmp_path / "13b", edit))
    assert "E713" in str(info.value) and "ALiBi" in str(info.value)
