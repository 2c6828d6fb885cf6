"""GLM-4V-9B (the chatglm_vision family): the import of the remote-code checkpoint, which family a
chatglm config goes to, and the terms of the EVA2-CLIP-E tower, the projector and the image positions
in the language model, with the arithmetic. No measured record: the remote code (modeling_chatglm.py,
visual.py) cannot be traced (see the family's notes).
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
SPEC = ROOT / "specs" / "chatglm_vision" / "glm-4v-9b.yaml"
SEQ, HIDDEN = 2048, 4096
# the tower: 80 x 80 patches of 14 px at 1120 px and the class token; width 1792, 16 heads of 112
POS, WIDTH, HEADS, MLP = 6401, 1792, 16, 15360
X = POS * WIDTH * 2  # one [1, 6401, 1792] bf16 tensor: 22_941_184


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    result = importer.import_spec(str(hf.FIXTURES / "glm-4v-9b"))
    assert hf.modules(written) == hf.modules(result.spec)
    assert result.family == "chatglm_vision"
    assert written.image_tokens == 1602  # (80 // 2)^2 features, boi and eoi


def test_a_chatglm_config_without_vision_config_stays_chatglm():
    assert importer.import_spec(str(hf.FIXTURES / "glm-4-9b-chat")).family == "chatglm"


def _rows(**kw) -> dict:
    args = {"micro_batch": 1, "seq_len": SEQ, "images_per_sample": 1, **kw}
    return {r.path: r for r in api.estimate(str(SPEC), **args).rows}


def test_tower_layer_terms_when_trained():
    rows = _rows(trainable=["vision", "projector", "language"])
    layer = "vision.layers[0:63]"
    # query_key_value saves the layer's input, 6401 x 1792 x 2
    assert rows[layer + ".query_key_value"].activations == X
    # sdpa's flash kernel: q, k, v (views of the one 3 x 1792 output) 3 x X, its output X, the fp32
    # logsumexp 16 x 6401 x 4 = 409_664 and the philox seed and offset 16 + 8
    assert rows[layer + ".core"].activations == 3 * X + X + HEADS * POS * 4 + 24
    # the norms on the branches save dense's and fc2's outputs, with fp32 mean and rstd 2 x 6401 x 4
    assert rows[layer + ".input_layernorm"].activations == X + 2 * POS * 4
    assert rows[layer + ".post_attention_layernorm"].activations == X + 2 * POS * 4
    # the MLP: fc1's input (the residual after the attention), GELU's input and fc2's input
    assert rows[layer + ".fc1"].activations == X
    assert rows[layer + ".act"].activations == POS * MLP * 2
    assert rows[layer + ".fc2"].activations == POS * MLP * 2
    # the pixels' bf16 copy the trained patch conv saves: 3 x 1120 x 1120 x 2
    assert rows["vision.proj"].activations == 3 * 1120 * 1120 * 2


def test_tower_saves_nothing_when_frozen():
    rows = _rows(trainable=["language"])
    assert sum(r.activations or 0 for p, r in rows.items() if p.startswith(("vision", "projector"))) == 0


def test_projector_terms_when_trained():
    rows = _rows(trainable=["vision", "projector", "language"])
    feats = 1600
    # the conv saves its input, the 80 x 80 grid of the tower's patches: 6400 x 1792 x 2
    assert rows["projector.conv"].activations == 6400 * WIDTH * 2
    # linear_proj's input (the transposed conv output folded by F.linear), 1600 x 4096 x 2
    assert rows["projector.linear_proj"].activations == feats * HIDDEN * 2
    # norm1 saves its input and fp32 mean and rstd; GELU its input
    assert rows["projector.norm1"].activations == feats * HIDDEN * 2 + 2 * feats * 4
    assert rows["projector.act1"].activations == feats * HIDDEN * 2
    # the GLU: gate_proj and dense_h_to_4h share GELU's output; silu saves the gate, the product
    # both factors, dense_4h_to_h the product (13696 wide)
    assert rows["projector.glu.act"].activations == feats * 13696 * 2
    assert rows["projector.glu.mul"].activations == 2 * feats * 13696 * 2
    assert rows["projector.glu.down_proj"].activations == feats * 13696 * 2
    # the cat of boi, the features and eoi, and its divide by scaling_factor: 2 x 1602 x 4096 x 2
    assert rows["projector"].transient_forward == 2 * 1602 * HIDDEN * 2


def test_the_image_positions_held_through_the_language_layers():
    with_image = _rows(trainable=["language"])["language.layers[0:40]"].transient_forward
    text_only = _rows(trainable=["language"], images_per_sample=0)["language.layers[0:40]"].transient_forward
    # images_features [1, 1602, 4096] bf16, the per-sample cat the stacked embeddings copy
    # [2048, 4096] bf16, the position ids' cat and stack 2 x 2048 x 8
    assert with_image - text_only == 1602 * HIDDEN * 2 + SEQ * HIDDEN * 2 + 2 * SEQ * 8
    # text only, as the chatglm family's GLM-4-9B-chat: one layer input, the embeddings and the rope cache
    assert text_only == 2 * SEQ * HIDDEN * 2 + 2 * SEQ * 64 * 2


def test_language_layers_run_core_attention_eager_under_sdpa():
    rows = _rows(trainable=["language"])
    layer = "language.layers[0:40]"
    # CoreAttention: q, k and v copied out to all 32 heads 3 x 2048 x 4096 x 2, the fp32 softmax
    # 32 x 2048^2 x 4 and its 16-bit cast 32 x 2048^2 x 2 (saved by bmm)
    assert rows[layer + ".self_attention.core"].activations == 3 * SEQ * HIDDEN * 2 + 32 * SEQ * SEQ * (4 + 2)
    # each layer's own inverted causal mask [1, 1, 2048, 2048] bool, saved by masked_fill
    assert rows[layer].activations == SEQ * SEQ


def test_text_only_language_is_glm_4_9b_chat_but_for_the_core_attention():
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=SEQ, images_per_sample=0, trainable=["language"])
    chat = api.estimate(str(ROOT / "specs" / "chatglm" / "glm-4-9b-chat.yaml"), micro_batch=1, seq_len=SEQ)
    eager_only = ("language.layers[0:40]", "language.layers[0:40].self_attention.core")
    ours = {r.path: r.activations for r in est.rows if r.path.startswith("language") and r.path not in eager_only}
    theirs = {r.path: r.activations for r in chat.rows if r.path.startswith("language") and r.path not in eager_only}
    assert ours == theirs


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"images_per_sample": 2, "seq_len": 4096}, "E404"),  # one image per sample: the vision seq is -1
        ({"attention": "eager"}, "E714"),  # the tower always runs sdpa
        ({"attention": "flash_attention_2"}, "E714"),
        ({"seq_len": 1024}, "E501"),  # shorter than the image's 1602 positions
        ({"tp": 2}, "E318"),  # remote code: plain steps only
        ({"loss": "fused_linear_cross_entropy"}, "E317"),
        ({"packing": True, "images_per_sample": 0}, "E316"),
    ],
)
def test_setups_not_modelled_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), **{"micro_batch": 1, "seq_len": SEQ, "images_per_sample": 1, **override})
    assert code in [d.code for d in info.value.diagnostics]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"image_size": 448, "num_positions": 1025}, "1600"),  # the labels' hard-coded 1600
        ({"num_positions": 6400}, "num_positions"),
        ({"hidden_act": "quick_gelu"}, "gelu"),
        ({"dropout_prob": 0.1}, "dropout"),
    ],
)
def test_vision_configs_not_modelled_are_refused(tmp_path, change, says):
    config = copy.deepcopy(hf.GLM_4V_9B)
    config["vision_config"].update(change)
    config["vision_config"]["num_hidden_layers"] = 1
    config["num_layers"] = config["num_hidden_layers"] = 1
    hf.write_checkpoint(tmp_path / "m", config, hf.glm4v_9b_tensors(config))
    with pytest.raises(MemspecError) as info:
        importer.import_spec(str(tmp_path / "m"))
    assert says in str(info.value)
