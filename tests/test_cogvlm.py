"""CogVLM v1 (the cogvlm family): the import of the remote-code checkpoint (a config.json without
model_type, told from CogVLM2's by Vicuna's vocabulary), and the terms where v1's code differs from
CogVLM2's: no checkpointing of its own, MHA (the kernel reads the fused projection's views, no k /
v copies), no bias on the vision expert's query_key_value, the projector without a conv. No
measured record: the remote code cannot be traced (see the family's notes).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "cogvlm" / "cogvlm-chat-hf.yaml"
SEQ, HIDDEN, INTER, VOCAB = 2048, 4096, 11008, 32000
X = SEQ * HIDDEN * 2  # one [1, 2048, 4096] bf16 tensor: 16_777_216
# one 490 px image: 1227 positions (boi, 35 x 35 features, eoi); the vision expert takes boi and
# the features (get_expert_mask), eoi and the text the language expert
VIS = 1226
LANG = SEQ - VIS  # 822
ATTN = "language.layers[0:32].self_attn"
MLP = "language.layers[0:32].mlp"


def _rows(**kw) -> dict:
    args = {"micro_batch": 1, "seq_len": SEQ, "images_per_sample": 1, "trainable": ["language"], **kw}
    return {r.path: r for r in api.estimate(str(SPEC), **args).rows}


def _import_variant(tmp_path, **change):
    config = copy.deepcopy(hf.COGVLM_CHAT_HF)
    vision = change.pop("vision_config", {})
    config.update(change)
    config["vision_config"].update(vision)
    config["vision_config"]["num_hidden_layers"] = 1
    config["num_hidden_layers"] = 1
    hf.write_checkpoint(tmp_path / "m", config, hf.cogvlm_tensors(config))
    return importer.import_spec(str(tmp_path / "m"))


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    result = importer.import_spec(str(hf.FIXTURES / "cogvlm-chat-hf"))
    assert hf.modules(written) == hf.modules(result.spec)
    assert result.family == "cogvlm"
    assert written.image_tokens == 1227  # 35^2 features, boi and eoi


def test_the_224_px_base_model_imports(tmp_path):
    # cogvlm-base-224-hf: a 16 x 16 grid (num_positions 257): 256 features, boi and eoi
    result = _import_variant(tmp_path, vision_config={"image_size": 224, "num_positions": 257})
    assert result.family == "cogvlm"
    assert result.spec.image_tokens == 258


def test_llama3_vocabulary_goes_to_cogvlm2(tmp_path):
    # the same architecture name with CogVLM2's vocabulary: the cogvlm2 family, whose conv needs
    # an even grid (35 is odd)
    with pytest.raises(MemspecError) as info:
        _import_variant(tmp_path, vocab_size=128256)
    assert [d.code for d in info.value.diagnostics] == ["E713"]
    assert "even patch grid" in info.value.diagnostics[0].message


def test_grouped_heads_are_refused(tmp_path):
    with pytest.raises(MemspecError) as info:
        _import_variant(tmp_path, num_multi_query_heads=8)
    assert [d.code for d in info.value.diagnostics] == ["E713"]
    assert "num_multi_query_heads" in info.value.diagnostics[0].message


def test_the_language_model_is_not_checkpointed_by_its_own_code():
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=SEQ, images_per_sample=1, trainable=["language"])
    assert est.setup.gradient_checkpointing == frozenset()


def test_parameters_per_expert():
    rows = _rows()
    # no bias on v1's vision expert: each layer's query_key_value 3 x 4096 x 4096 = 50_331_648
    # weights in bf16, the vision expert's as the language one's (CogVLM2's adds a bias)
    assert rows[ATTN + ".vision_expert_query_key_value"].parameters == 3 * HIDDEN * HIDDEN * 2
    assert rows[ATTN + ".language_expert_query_key_value"].parameters == 3 * HIDDEN * HIDDEN * 2


def test_expert_attention_terms_when_trained():
    rows = _rows()
    assert rows[ATTN + ".vision_expert_query_key_value"].activations == VIS * HIDDEN * 2
    assert rows[ATTN + ".language_expert_query_key_value"].activations == LANG * HIDDEN * 2
    # the rotary (modelled as the triton FastRotaryEmbedding): cos and sin [1, 2048, 64] bf16
    assert rows[ATTN + ".rotary"].activations == 2 * SEQ * 64 * 2
    # MHA: no expand, no copies; the kernel's k and v are mixed_raw_layer's slices, 2 x 4096 per
    # position: 2048 * 8192 * 2 = 2X
    assert rows[ATTN + ".prep"].activations == 2 * X
    assert rows[ATTN + ".prep"].transient_forward == SEQ * SEQ * 8
    # flash (is_causal, no mask): q X, its output X, lse 32 * 2048 * 4, philox 16 + 8
    assert rows[ATTN + ".core"].activations == 2 * X + 32 * SEQ * 4 + 24
    assert rows[ATTN + ".vision_expert_dense"].activations == VIS * HIDDEN * 2
    assert rows[ATTN + ".language_expert_dense"].activations == LANG * HIDDEN * 2
    assert rows[ATTN].activations == 2 * SEQ


def test_expert_mlp_terms_when_trained():
    rows = _rows()
    for expert, n in (("vision_mlp", VIS), ("language_mlp", LANG)):
        assert rows[f"{MLP}.{expert}.gate_proj"].activations == n * HIDDEN * 2
        assert rows[f"{MLP}.{expert}.act"].activations == n * INTER * 2
        assert rows[f"{MLP}.{expert}.mul"].activations == 2 * n * INTER * 2
        assert rows[f"{MLP}.{expert}.down_proj"].activations == n * INTER * 2


def test_projector_terms_when_trained():
    rows = _rows(trainable=["vision", "projector", "language"])
    # no conv: linear_proj reads the tower's 1225 patch rows of 1792 (x[:, 1:], a view)
    assert "projector.conv" not in rows
    assert rows["projector.linear_proj"].activations == 1225 * 1792 * 2
    assert rows["projector.glu.down_proj"].activations == 1225 * INTER * 2
    # torch.cat((boi, x, eoi)): 1227 x 4096 x 2
    assert rows["projector"].transient_forward == 1227 * HIDDEN * 2
    # the tower's query_key_value saves its input, 1226 positions of 1792
    assert rows["vision.layers[0:63].query_key_value"].activations == 1226 * 1792 * 2
    # the batch's image, [3, 490, 490] bf16
    assert rows["vision"].buffers == 3 * 490 * 490 * 2


def test_mask_and_image_positions_before_the_layers():
    rows = _rows()
    assert rows["language.image_merge[0]"].activations == 2 * 1227 * 8
    # _make_causal_mask and _expand_mask: 2048^2 * (2 + 3 * 2 + 1), on top of the embeddings X,
    # images_features 1227 x 4096 x 2 and the bool attention_mask 2048
    assert rows["language.mask"].transient_forward == SEQ * SEQ * 9 + X + 1227 * HIDDEN * 2 + SEQ


def test_the_loss_is_over_the_shifted_fp32_logits():
    rows = _rows()
    # 2047 * 32000 * 4 = 262_016_000, with the fp32 total weight, the loss and its seed gradient
    assert rows["language.loss"].activations == 2047 * VOCAB * 4 + 12


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"images_per_sample": 2, "seq_len": 4096}, "E404"),  # one image per sample
        ({"attention": "eager"}, "E714"),  # the remote code calls sdpa itself
        ({"seq_len": 1024}, "E501"),  # shorter than the image's 1227 positions
        ({"tp": 2}, "E318"),  # remote code: plain steps only
        ({"lora": {"r": 8, "target_modules": ["query_key_value"]}}, "E335"),  # the tower's too
        ({"lora": {"r": 8, "target_modules": "all-linear"}}, "E335"),
        # supports_gradient_checkpointing False: transformers' gradient_checkpointing_enable refuses
        ({"gradient_checkpointing": ["language"]}, "E336"),
        ({"gradient_checkpointing": ["vision"]}, "E336"),
    ],
)
def test_setups_not_modelled_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), **{"micro_batch": 1, "seq_len": SEQ, "images_per_sample": 1, "trainable": ["language"], **override})
    assert code in [d.code for d in info.value.diagnostics]
