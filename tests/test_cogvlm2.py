"""CogVLM2 (the cogvlm2 family): the import of the remote-code checkpoint (a config.json without
model_type), and the terms of the visual expert's routing, the remote attention, the mask, the
projector and the loss, with the arithmetic. No measured record: the remote code
(modeling_cogvlm.py, visual.py, util.py) cannot be traced (see the family's notes).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from compiler.pipeline import render

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "cogvlm2" / "cogvlm2-llama3-chat-19b.yaml"
SEQ, HIDDEN, INTER, VOCAB = 4096, 4096, 14336, 128256
X = SEQ * HIDDEN * 2  # one [1, 4096, 4096] bf16 tensor: 33_554_432
# one 1344 px image: 2306 positions (boi, 48 x 48 features, eoi); the vision expert takes boi and
# the features (get_expert_mask: an image position followed by another), eoi and the text the
# language expert
VIS = 2305
LANG = SEQ - VIS  # 1791
ATTN = "language.layers[0:32].self_attn"
MLP = "language.layers[0:32].mlp"


def _rows(**kw) -> dict:
    args = {"micro_batch": 1, "seq_len": SEQ, "images_per_sample": 1, "trainable": ["language"], **kw}
    return {r.path: r for r in api.estimate(str(SPEC), **args).rows}


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    result = importer.import_spec(str(hf.FIXTURES / "cogvlm2-llama3-chat-19B"))
    assert hf.modules(written) == hf.modules(result.spec)
    assert result.family == "cogvlm2"
    assert written.image_tokens == 2306  # (96 // 2)^2 features, boi and eoi


def test_a_config_without_model_type_goes_by_its_first_architecture(tmp_path):
    assert "model_type" not in hf.COGVLM2_LLAMA3_CHAT_19B
    config = copy.deepcopy(hf.COGVLM2_LLAMA3_CHAT_19B)
    config["architectures"] = ["CogVLMVideoForCausalLM"]  # the video model: other remote code
    hf.write_checkpoint(tmp_path / "m", config, hf.cogvlm2_tensors(config))
    with pytest.raises(MemspecError) as info:
        importer.import_spec(str(tmp_path / "m"))
    (d,) = info.value.diagnostics
    assert d.code == "E708" and "'CogVLMVideoForCausalLM'" in d.message


def test_the_language_model_is_checkpointed_whatever_the_setting():
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=SEQ, images_per_sample=1, trainable=["language"])
    assert est.setup.gradient_checkpointing == frozenset({"language"})
    rows = {r.path: r for r in est.rows}
    # the first layer's checkpoint keeps its input X, the [1, 1, 4096, 4096] bf16 additive mask
    # 4096^2 * 2 = 33_554_432 and the position ids 4096 * 8 (both shared by every layer); the others X
    assert rows["language.layers[0]"].activations == X + SEQ * SEQ * 2 + SEQ * 8
    assert rows["language.layers[1:32]"].activations == X
    # the output says why, where the setting said off
    assert "checkpointing language (language by the model's own code, whatever the setting)" in render.setup_line(est)


def test_expert_attention_terms_when_trained():
    rows = _rows()
    # each expert's query_key_value saves the rows it gathered from the normed hidden states
    assert rows[ATTN + ".vision_expert_query_key_value"].activations == VIS * HIDDEN * 2
    assert rows[ATTN + ".language_expert_query_key_value"].activations == LANG * HIDDEN * 2
    # FastRotaryEmbedding: cos and sin gathered per sample [1, 4096, 64] bf16, saved by ApplyRotaryEmb
    assert rows[ATTN + ".rotary"].activations == 2 * SEQ * 64 * 2
    # mixed_raw_layer's k and v slices (kept by the kernel's q view) 4096 * 2 * 8 * 128 * 2, and k
    # and v copied out to all 32 heads 2 * X
    assert rows[ATTN + ".prep"].activations == SEQ * 2048 * 2 + 2 * X
    # attention_fn's checks: two fp32 [1, 1, s, s] (ones, tril) 4096^2 * 8, beside the bool
    # (attention_mask == 0) the attention holds through the kernel, with the dense outputs' target X
    assert rows[ATTN + ".prep"].transient_forward == SEQ * SEQ * 8
    assert rows[ATTN].transient_forward == X + SEQ * SEQ
    # sdpa's flash kernel (is_causal, no mask): q X, its output X, lse 32 * 4096 * 4, philox 16 + 8
    assert rows[ATTN + ".core"].activations == 2 * X + 32 * SEQ * 4 + 24
    # the denses save their rows of the kernel's output, index copies: one X more than Llama's o_proj
    assert rows[ATTN + ".vision_expert_dense"].activations == VIS * HIDDEN * 2
    assert rows[ATTN + ".language_expert_dense"].activations == LANG * HIDDEN * 2
    # the two [1, 4096] bool expert masks the index ops keep
    assert rows[ATTN].activations == 2 * SEQ


def test_expert_mlp_terms_when_trained():
    rows = _rows()
    for expert, n in (("vision_mlp", VIS), ("language_mlp", LANG)):
        # gate_proj and up_proj share the gathered rows; silu saves the gate, the product both
        # factors, down_proj the product
        assert rows[f"{MLP}.{expert}.gate_proj"].activations == n * HIDDEN * 2
        assert rows[f"{MLP}.{expert}.act"].activations == n * INTER * 2
        assert rows[f"{MLP}.{expert}.mul"].activations == 2 * n * INTER * 2
        assert rows[f"{MLP}.{expert}.down_proj"].activations == n * INTER * 2
    assert rows[MLP].activations == 2 * SEQ


def test_lora_on_the_vision_expert_saves_its_rows_only():
    rows = _rows(lora={"r": 8, "target_modules": ["vision_expert_query_key_value"]})
    qkv = ATTN + ".vision_expert_query_key_value"
    # lora_A saves the 2305 gathered image rows, not the sequence; lora_B its [2305, 8] input
    assert rows[qkv + ".lora_a"].activations == VIS * HIDDEN * 2
    assert rows[qkv + ".lora_b"].activations == VIS * 8 * 2
    # the frozen language expert saves nothing
    assert not rows["language.layers[1:32].self_attn.language_expert_query_key_value"].activations


def test_a_text_only_batch_runs_every_position_through_the_language_expert():
    rows = _rows(images_per_sample=0)
    assert rows[ATTN + ".vision_expert_query_key_value"].activations == 0
    assert rows[ATTN + ".language_expert_query_key_value"].activations == X
    assert rows[MLP + ".vision_mlp.act"].activations == 0
    assert "language.image_merge[0]" not in rows


def test_mask_and_image_positions_before_the_layers():
    rows = _rows()
    # the features written by index_put keep their two int64 index tensors 2 * 2306 * 8
    assert rows["language.image_merge[0]"].activations == 2 * 2306 * 8
    # _make_causal_mask and _expand_mask (an attention_mask of ones is always made): three
    # [1, 1, s, s] bf16 tensors and a bool beside the causal [s, s] 4096^2 * (2 + 3 * 2 + 1), on top
    # of what the forward holds: the embeddings X, images_features 2306 * 4096 * 2 and the bool
    # attention_mask 4096
    assert rows["language.mask"].transient_forward == SEQ * SEQ * 9 + X + 2306 * HIDDEN * 2 + SEQ


def test_projector_terms_when_trained():
    rows = _rows(trainable=["vision", "projector", "language"])
    # the conv (1792 -> 1792) saves the tower's 96 x 96 patches 9216 x 1792 x 2
    assert rows["projector.conv"].activations == 9216 * 1792 * 2
    # linear_proj reads the conv's 2304 outputs of the tower's width: 2304 x 1792 x 2
    assert rows["projector.linear_proj"].activations == 2304 * 1792 * 2
    # the GLU's widths are the language model's: dense_4h_to_h saves the [2304, 14336] product
    assert rows["projector.glu.down_proj"].activations == 2304 * INTER * 2
    # torch.cat((boi, x, eoi)), no divide: 2306 x 4096 x 2
    assert rows["projector"].transient_forward == 2306 * HIDDEN * 2
    # the tower's query_key_value saves its input, 9217 positions of 1792
    assert rows["vision.layers[0:63].query_key_value"].activations == 9217 * 1792 * 2
    # the batch's image, [3, 1344, 1344] bf16, a buffer of the step
    assert rows["vision"].buffers == 3 * 1344 * 1344 * 2


def test_the_loss_is_over_the_shifted_fp32_logits():
    rows = _rows()
    # log_softmax saves its fp32 result over 4095 positions 4095 * 128256 * 4 = 2_100_833_280, and
    # the fp32 total weight, the loss and its seed gradient 3 * 4
    assert rows["language.loss"].activations == 4095 * VOCAB * 4 + 12


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"images_per_sample": 2, "seq_len": 8192}, "E404"),  # one image per sample: the vision seq is -1
        ({"attention": "eager"}, "E714"),  # the remote code calls sdpa itself
        ({"attention": "flash_attention_2"}, "E714"),
        ({"seq_len": 2048}, "E501"),  # shorter than the image's 2306 positions
        ({"tp": 2}, "E318"),  # remote code: plain steps only
        ({"loss": "fused_linear_cross_entropy"}, "E317"),
        ({"packing": True, "images_per_sample": 0}, "E316"),
        # peft matches target names over the whole model: the tower's attention.query_key_value,
        # the projector's linear_proj.gate_proj, every linear of both under all-linear
        ({"lora": {"r": 8, "target_modules": ["query_key_value"]}}, "E335"),
        ({"lora": {"r": 8, "target_modules": ["gate_proj"]}}, "E335"),
        ({"lora": {"r": 8, "target_modules": "all-linear"}}, "E335"),
    ],
)
def test_setups_not_modelled_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), **{"micro_batch": 1, "seq_len": SEQ, "images_per_sample": 1, "trainable": ["language"], **override})
    assert code in [d.code for d in info.value.diagnostics]


def test_the_finetune_demo_targets_are_estimated():
    # peft_lora.py's default lm_head and its README's vision_expert_query_key_value reach the
    # language model only
    for targets in (["lm_head"], ["vision_expert_query_key_value"]):
        assert (
            api.estimate(str(SPEC), micro_batch=1, seq_len=SEQ, images_per_sample=1, trainable=["language"], lora={"r": 8, "target_modules": targets}).allocated
            > 0
        )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"image_size": 490, "num_positions": 1226}, "even patch grid"),  # CogVLM (v1)'s 35 x 35
        ({"num_positions": 9216}, "num_positions"),
        ({"hidden_act": "quick_gelu"}, "gelu"),
        ({"dropout_prob": 0.1}, "dropout"),
    ],
)
def test_vision_configs_not_modelled_are_refused(tmp_path, change, says):
    config = copy.deepcopy(hf.COGVLM2_LLAMA3_CHAT_19B)
    config["vision_config"].update(change)
    config["vision_config"]["num_hidden_layers"] = 1
    config["num_hidden_layers"] = 1
    hf.write_checkpoint(tmp_path / "m", config, hf.cogvlm2_tensors(config))
    with pytest.raises(MemspecError) as info:
        importer.import_spec(str(tmp_path / "m"))
    assert [d.code for d in info.value.diagnostics] == ["E713"]
    assert says in info.value.diagnostics[0].message
