"""Phi-3-vision (the phi3_v family, remote code Phi3VForCausalLM): the import of the remote-code
checkpoint, the processor's HD crop count, and the terms the remote code adds to or takes from
Phi-3-mini's layers, CLIP's tower and LLaVA's projector, with the arithmetic.
No measured record: there is no Phi3V class in transformers to trace (see the family's notes).
"""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from compiler.library.expr_python import FUNCTIONS

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "phi3_v" / "phi-3-vision-128k-instruct.yaml"
PHI3 = ROOT / "specs" / "phi3" / "phi-3-mini-4k-instruct.yaml"
FIXTURE = hf.FIXTURES / "Phi-3-vision-128k-instruct"
SPEC_35 = ROOT / "specs" / "phi3_v" / "phi-3.5-vision-instruct.yaml"
FIXTURE_35 = hf.FIXTURES / "Phi-3.5-vision-instruct"
TOKENS, HIDDEN, VOCAB, HEAD = 4096, 3072, 32064, 96
X = TOKENS * HIDDEN * 2  # one [1, 4096, 3072] bf16 tensor: 25_165_824
TRAIN = ["projector", "language"]  # the usual recipe: the CLIP tower frozen


def _positions(rows: int, cols: int) -> int:
    """Phi3VImageProcessor's num_img_tokens for an HD image of rows x cols 336 px crops."""
    return (rows * cols + 1) * 144 + 1 + (rows + 1) * 12


def _rows(**kw) -> dict:
    args = {"micro_batch": 1, "seq_len": TOKENS, "trainable": TRAIN} | kw
    est = api.estimate(str(SPEC), **args)
    return {r.path: r for r in est.rows}


@pytest.mark.parametrize(("spec", "fixture"), [(SPEC, FIXTURE), (SPEC_35, FIXTURE_35)])
def test_the_checked_in_specs_are_what_import_writes(spec, fixture):
    assert hf.modules(api.load_spec(spec)) == hf.modules(importer.import_spec(str(fixture)).spec)


def test_phi3_vision_128k_imports_as_phi3_with_hd_crops():
    written = api.load_spec(SPEC)
    language = written.modules[2].inputs
    assert (language["phi3v"], language["fused"], language["hd_crops"], language["image_tokens"]) == (True, True, 16, 144)
    # a square image is 4 x 4 crops at num_crops 16: (16 + 1) * 144 + 1 + 5 * 12
    assert written.image_tokens == _positions(4, 4) == 2509


@pytest.mark.parametrize(
    ("h", "w", "crops", "grid"),
    [
        # square: the largest scale with scale * ceil(scale / 1) <= 16 is 4; <= 4 is 2
        (336, 336, 16, (4, 4)),
        (336, 336, 4, (2, 2)),
        # 1000 x 1500 (h x w): ratio 1.5, scale 4 (4 * ceil(2.67) = 12; 5 * ceil(3.33) = 20 > 16),
        # 1344 px wide, int(1344 / 1.5) = 896 px high, padded to 3 crops
        (1000, 1500, 16, (3, 4)),
        # taller: transposed, the same grid turned
        (1500, 1000, 16, (4, 3)),
        # 200 x 2000: ratio 10, scale 10 (10 * ceil(1.0) = 10; 11 * ceil(1.1) = 22), int(3360 / 10) = 336 px: one row
        (200, 2000, 16, (1, 10)),
        # num_crops 4: ratio 10, scale 4 (4 * 1; 5 * ceil(0.5) = 5 > 4)
        (200, 2000, 4, (1, 4)),
    ],
)
def test_hd_grid_is_the_processors(h, w, crops, grid):
    assert (FUNCTIONS["hd_rows"](h, w, 336, crops), FUNCTIONS["hd_cols"](h, w, 336, crops)) == grid


def test_hd_grid_refuses_sizes_out_of_range():
    with pytest.raises(ValueError, match="hd_rows"):
        FUNCTIONS["hd_rows"](336, 336, 336, 65)


def test_positions_per_image_follow_the_image_size():
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=TOKENS, trainable=TRAIN, image_size=(1000, 1500))
    rows = {r.path: r for r in est.rows}
    # 3 x 4 crops: (12 + 1) * 144 + 1 + 4 * 12 = 1921 positions of index_put, two int64 indices each
    assert _positions(3, 4) == 1921
    assert rows["language.image_merge[0]"].activations == 2 * 1921 * 8
    assert api.image_tokens_per_sample(est.nodes) == 1921
    # an image whose positions outgrow seq_len is refused: 2 square images are 2 * 2509
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), micro_batch=1, seq_len=4096, images_per_sample=2)
    assert "2509" in str(info.value)


def test_the_tower_reads_every_padded_crop_and_saves_nothing_frozen():
    rows = _rows()
    # num_crops + 1 = 17 crops of 576 patches, 1024 wide: the patch conv's output 17 * 576 * 1024 * 2
    assert rows["vision.patch_embedding"].transient_forward == 17 * 576 * 1024 * 2
    # frozen, with pixel_values needing no gradient: no saved tensor anywhere in the tower
    assert sum(r.activations or 0 for p, r in rows.items() if p.startswith("vision")) == 0
    # the checkpoint's CLIP ViT-L/14-336 under model.vision_embed_tokens.img_processor., post_layernorm
    # included: patch 602_112 + class / positions 591_872 + pre-LN 2048 + 24 * 12_596_224 + post-LN 2048
    assert importer.import_spec(str(FIXTURE)).header_parameters["vision"] == 303_507_456


def test_hd_transform_and_projection_terms():
    rows = _rows()
    n, row = 2509, 4096 * 2  # positions of one square image; one 4 x 1024 merged feature, bf16
    projector = rows["projector"]
    # glb_GN [1, 1, 4096] and sub_GN [1, 1, 1, 4096], bf16
    assert projector.parameters == 2 * 4096 * 2
    # held through img_projection: the tower's hidden_states[-2] 17 * 577 * 1024 * 2 = 20_088_832;
    # the global image's merged copy 144 rows and its newline copy 12 * 13 rows; the sub-images'
    # newline copy 4 * 12 * (4 * 12 + 1) = 2352 rows and merged copy 16 * 144 = 2304 rows
    assert projector.transient_forward == 17 * 577 * 1024 * 2 + (144 + 156 + 2352 + 2304) * row == 60_688_384
    # img_projection.0 saves the concatenation [2509, 4096], GELU its input, .2 GELU's output [2509, 3072]
    assert rows["projector.img_projection.linear_1"].activations == n * row
    assert rows["projector.img_projection.act"].activations == n * 3072 * 2
    assert rows["projector.img_projection.linear_2"].activations == n * 3072 * 2
    # the separators train, so the concatenation's gradient is computed: dX [2509, 4096] beside dY [2509, 3072]
    assert rows["projector.img_projection.linear_1"].transient_backward == n * row + n * 3072 * 2
    # LLaVA-style mlp_projector parameters: 4096 * 3072 + 3072 + 3072^2 + 3072 = 22_026_240, bf16
    assert rows["projector.img_projection.linear_1"].parameters + rows["projector.img_projection.linear_2"].parameters == 22_026_240 * 2


def test_with_peft_and_checkpointing_the_gradient_runs_into_the_tower():
    plain = _rows(trainable=["projector"], lora={"r": 16, "target_modules": ["qkv_proj", "o_proj"]})
    hooked = _rows(trainable=["projector"], lora={"r": 16, "target_modules": ["qkv_proj", "o_proj"]}, gradient_checkpointing=["language"])
    assert plain["projector"].transient_backward == 0
    # enable_input_require_grads: the patch embedding's output requires grad, so the HD transform's
    # backward reaches the feature map: two of them 2 * 17 * 577 * 1024 * 2 (the crops' zero-filled
    # gradients summed, the class-token slice's) and the last image's two copies 2 * 16 * 144 * 4096 * 2
    assert hooked["projector"].transient_backward == 2 * 17 * 577 * 1024 * 2 + 2 * 16 * 144 * 4096 * 2
    assert sum(r.activations or 0 for p, r in hooked.items() if p.startswith("vision")) > 0


def test_the_merge_is_an_out_of_place_index_put():
    merge = _rows()["language.image_merge[0]"]
    # the nonzero's two int64 index tensors over the 2509 image positions, saved by IndexPutBackward0;
    # no bool mask and no features kept by an output object
    assert merge.activations == 2 * 2509 * 8
    # the projected features 2509 * 3072 * 2 + the new embeddings X + the indices
    assert merge.transient_forward == 2509 * HIDDEN * 2 + X + 2 * 2509 * 8
    # backward: the embeddings' gradient copy X, the zeros and the values' gradient (2 features)
    assert merge.transient_backward == X + 2 * 2509 * HIDDEN * 2


def test_layers_against_phi3_mini():
    ours = _rows()
    mini = {r.path: r for r in api.estimate(str(PHI3), micro_batch=1, seq_len=TOKENS, attention="flash_attention_2").rows}
    layer = "language.fused_layers[0:32].self_attn"
    # each layer's own cos and sin [1, 4096, 96] bf16 (Phi-3-mini's are the model's, charged once)
    assert ours[layer + ".rotary"].activations == 2 * TOKENS * HEAD * 2 == 1_572_864
    # (Phi-3-mini charges its pair once, in the first layer)
    assert "language.fused_layers[0].self_attn.rotary" in mini and layer + ".rotary" not in mini
    # and its fp32 table: freqs [4096, 48], emb, cos, sin and sin's scaled product [4096, 96]
    assert ours[layer + ".rope_table[0]"].transient_forward == (4 * TOKENS * HEAD + TOKENS * 48) * 4
    # the flash output is already [b, s, h, d]: o_proj reads it, the kernel's output is its saved
    # input, and Phi-3-mini's copy (kernel_out beside attn_out, one X) is gone
    assert layer + ".core_masked[0]" in ours and layer + ".core[0]" not in ours
    attention = sum(r.activations or 0 for p, r in ours.items() if p.startswith(layer) and not p.endswith((".rotary", ".rope_table[0]")))
    attention_mini = sum(r.activations or 0 for p, r in mini.items() if p.startswith(layer))
    assert attention_mini - attention == X
    # the same qkv_proj, gate_up_proj and MLP as Phi-3-mini (vocab 32064, 32 layers of 3072)
    assert ours["language.fused_layers[0:32].mlp.gate_up_proj"].parameters == mini["language.fused_layers[0:32].mlp.gate_up_proj"].parameters


def test_a_checkpointed_layer_keeps_no_cos_and_sin():
    ours = _rows(gradient_checkpointing=["language"])
    mini = {r.path: r for r in api.estimate(str(PHI3), micro_batch=1, seq_len=TOKENS, gradient_checkpointing=["language"]).rows}
    # the remote layers make cos and sin inside: the first checkpoint keeps the input X and
    # position_ids [1, 4096] int64; Phi-3-mini's also the model's cos and sin 2 * 4096 * 96 * 2 and
    # the sliding window's bool [1, 1, 4096, 4096] mask (seq 4096 >= its window 2047; Phi-3-vision's is 131072)
    assert ours["language.fused_layers[0]"].activations == X + TOKENS * 8
    assert mini["language.fused_layers[0]"].activations == X + TOKENS * 8 + 2 * TOKENS * HEAD * 2 + TOKENS * TOKENS
    # the other checkpoints keep their input alone (position_ids, cos, sin and the mask are the first's tensors)
    assert ours["language.fused_layers[1:32]"].activations == mini["language.fused_layers[1:32]"].activations == X


def test_the_remote_loss_is_over_fp32_logits_and_their_shifted_copy():
    loss = _rows()["language.loss"]
    # Phi3VForCausalLM: logits.float(), then logits[..., :-1, :].contiguous(): log-probs over
    # s - 1 positions, fp32; three fp32 scalars (nll_loss's total_weight, the loss, its seed gradient)
    # (the log-probs' block rounded up to the allocator's 512 bytes)
    assert loss.activations == -(-(TOKENS - 1) * VOCAB * 4 // 512) * 512 + 3 * 4
    # the fp32 logits; their [:, :-1] slice is already contiguous at batch 1
    assert loss.transient_forward == TOKENS * VOCAB * 4


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"attention": "eager"}, "E714"),  # the remote eager path's q and k copies are not modelled
        ({"attention": "sdpa"}, "E714"),  # Phi3VPreTrainedModel: _supports_sdpa = False
        ({"precision": "bf16-mixed", "precision_mode": "autocast"}, "E325"),  # the features cast to the projection's dtype
        ({"tp": 2}, "E318"),
        ({"loss": "fused_linear_cross_entropy"}, "E317"),  # the remote code's own cross-entropy
        ({"packing": True, "images_per_sample": 0}, "E316"),  # its flash path takes no packed position_ids
        ({"activation_offloading": True}, "E316"),
    ],
)
def test_setups_not_modelled_for_phi3_v_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), micro_batch=1, seq_len=TOKENS, **override)
    assert code in [d.code for d in info.value.diagnostics]


@pytest.mark.parametrize(
    ("where", "key", "value", "says"),
    [
        ("embd_layer", "projection_cls", "linear", "projection_cls mlp"),
        ("embd_layer", "hd_transform_order", "glb_sub", "sub_glb"),
        ("embd_layer", "use_hd_transform", False, "use_hd_transform"),
        ("img_processor", "model_name", "openai/clip-vit-base-patch32", "clip-vit-large-patch14-336"),
        ("img_processor", "type_feature", "cls_patch", "type_feature patch"),
        ("", "hidden_act", "gelu", "silu"),
        ("", "embd_pdrop", 0.1, "dropout"),
    ],
)
def test_config_variants_are_refused(tmp_path, where, key, value, says):
    assert says in hf.refusal(FIXTURE, tmp_path / "copy", where, key, value)


def test_a_yarn_rotary_is_refused(tmp_path):
    def edit(data):
        data["rope_scaling"]["type"] = "yarn"

    with pytest.raises(MemspecError, match="_init_rope raises"):
        importer.import_spec(hf.edited_copy(FIXTURE, tmp_path / "copy", edit))


def test_phi3_5_vision_takes_num_crops_4():
    # Phi-3.5-vision's preprocessor_config.json: num_crops 4; a square image is 2 x 2 crops,
    # (4 + 1) * 144 + 1 + 3 * 12 = 757 positions
    assert api.load_spec(SPEC_35).image_tokens == _positions(2, 2) == 757
    rows = {r.path: r for r in api.estimate(str(SPEC_35), micro_batch=1, seq_len=2048, trainable=TRAIN).rows}
    # the tower reads num_crops + 1 = 5 crops
    assert rows["vision.patch_embedding"].transient_forward == 5 * 576 * 1024 * 2
    assert rows["language.image_merge[0]"].activations == 2 * 757 * 8
