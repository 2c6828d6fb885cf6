"""Yi-VL (the yi_vl family: BUAADreamer/Yi-VL-6B-hf and -34B-hf, LlavaForConditionalGeneration
marked is_yi_vl_derived_model): the import of the reconstructed fixtures, the terms the Yi-VL
projector (Linear, LayerNorm, GELU, Linear, LayerNorm) and the tower's exact GELU add to LLaVA's,
with the arithmetic, the measuring builder's model against the spec, and the refusals (01-ai's
original config.json, the variants the formulas do not model, autocast)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "yi_vl" / "yi-vl-6b-hf.yaml"
FIX = hf.FIXTURES / "Yi-VL-6B-hf"
PATCHES, VISION, HIDDEN, INTER = 1024, 1280, 4096, 5120  # (448 / 14)^2 patches, CLS dropped
POSITIONS = PATCHES + 1  # the tower's sequence: the class token and 1024 patches


def _rows(**setup) -> dict:
    est = api.estimate(str(SPEC), **{"micro_batch": 1, "seq_len": 2048, "images_per_sample": 1, **setup})
    return {r.path: r for r in est.rows}


@pytest.mark.parametrize("size", ["6b", "34b"])
def test_the_checked_in_spec_is_what_import_writes(size):
    fixture = hf.FIXTURES / f"Yi-VL-{size.upper()}-hf"
    imported = importer.import_spec(str(fixture))
    assert imported.family == "yi_vl"
    written = api.load_spec(ROOT / "specs" / "yi_vl" / f"yi-vl-{size}-hf.yaml")
    assert hf.modules(written) == hf.modules(imported.spec)
    assert [m.type for m in written.modules] == ["clip_vision_tower", "yi_vl_projector", "llama_causal_lm"]
    assert written.image_tokens == PATCHES


def test_projector_terms():
    """A trainable projector on one 448 px image (1024 positions), bf16 weights, AdamW."""
    rows = _rows(trainable=["projector", "language"])
    # linear_1 4096 x 1280 + 4096 = 5_246_976, x 2 B; it saves its contiguous copy of the
    # strided features hidden_states[-2][:, 1:]: 1024 * 1280 * 2
    assert rows["projector.linear_1"].parameters == 10_493_952
    assert rows["projector.linear_1"].activations == 2_621_440
    # linear_2 is the first LayerNorm: weight and bias 2 * 4096 * 2 B; it saves linear_1's output
    # 1024 * 4096 * 2 = 8_388_608 and its fp32 mean and rstd 2 * 1024 * 4 = 8192
    assert (rows["projector.linear_2"].type, rows["projector.linear_2"].parameters) == ("layer_norm", 16_384)
    assert rows["projector.linear_2"].activations == 8_396_800
    # exact GELU saves its input, the LayerNorm's output: 1024 * 4096 * 2
    assert (rows["projector.act"].type, rows["projector.act"].activations) == ("gelu", 8_388_608)
    # linear_3 (4096^2 + 4096) * 2 B; it saves the GELU's output 1024 * 4096 * 2
    assert (rows["projector.linear_3"].parameters, rows["projector.linear_3"].activations) == (33_562_624, 8_388_608)
    # linear_4, the second LayerNorm: as linear_2
    assert (rows["projector.linear_4"].parameters, rows["projector.linear_4"].activations) == (16_384, 8_396_800)
    # 22_044_672 parameters: gradients 2 B and AdamW's fp32 master, exp_avg, exp_avg_sq 12 B each
    total = sum(r.optimizer_states for p, r in rows.items() if p.startswith("projector."))
    assert total == 22_044_672 * 12


def test_frozen_projector_saves_nothing():
    """The language model alone trained: no gradient reaches the projector or the frozen tower."""
    rows = _rows(trainable=["language"])
    assert sum(r.activations for p, r in rows.items() if p.startswith(("projector.", "vision."))) == 0


def test_tower_is_clip_with_exact_gelu():
    """The LAION ViT-H/14's MLP runs GELU (hidden_act 'gelu'): clip_gelu_encoder_layer, whose GELU
    saves its input only where quick_gelu saves two tensors (x and its sigmoid)."""
    rows = _rows(trainable=["vision", "projector"])
    layers = "vision.gelu_layers[0:31]"
    assert rows[layers].type == "clip_gelu_encoder_layer"
    assert not any(r.type in ("quick_gelu", "clip_encoder_layer") for r in rows.values())
    # fc1's output, 1025 positions x 5120 x 2 B, in each of the 31 layers below the feature layer
    assert rows[layers + ".mlp.act"].type == "gelu"
    assert rows[layers + ".mlp.act"].activations == POSITIONS * INTER * 2 == 10_496_000
    # the patch conv 1280 x 3 x 14 x 14 = 752_640 and the class and position table 1280 + 1025 * 1280
    assert rows["vision.patch_embedding"].parameters == 752_640 * 2
    assert rows["vision.embeddings"].parameters == (VISION + POSITIONS * VISION) * 2
    # layer 32 runs (hidden_states[-2] is its input) but reaches no loss: no gradient
    assert rows["vision.unused_gelu_layers[0].mlp.fc1"].gradients == 0
    assert rows["vision.unused_gelu_layers[0]"].count == 1


def test_language_sees_the_image_positions():
    """seq 2048 = 1024 image positions + 1024 text; GQA 32 / 4: k_proj 512 x 4096."""
    rows = _rows(trainable=["projector", "language"])
    k = rows["language.layers[0:32].self_attn.k_proj"]
    assert k.parameters == 512 * HIDDEN * 2
    assert rows["language.embed_tokens"].parameters == 64064 * HIDDEN * 2


def test_autocast_is_refused():
    """Under autocast both LayerNorms and the GELU between them run in fp32 (not modelled)."""
    with pytest.raises(MemspecError) as err:
        api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, precision="bf16-mixed", precision_mode="autocast")
    assert "E325" in err.value.render()


def test_builder_counts_equal_the_spec():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for, yi_vl

    assert family_for(FIX / "config.json") is yi_vl
    _, model = hf.meta_build(yi_vl, FIX)
    assert hf.module_counts(yi_vl, model) == importer.import_spec(str(FIX)).header_parameters
    assert type(model.model.multi_modal_projector.linear_2).__name__ == "LayerNorm"


# 01-ai/Yi-VL-6B's own config.json (LlavaLlamaForCausalLM, Yi's llava code), as far as the keys
# that decide the refusal go
ORIGINAL = {
    "architectures": ["LlavaLlamaForCausalLM"],
    "hidden_size": 4096,
    "mm_hidden_size": 1280,
    "mm_projector_type": "mlp2x_gelu_Norm",
    "mm_vision_select_layer": -2,
    "mm_vision_tower": "./vit/clip-vit-H-14-laion2B-s32B-b79K-yi-vl-6B-448",
    "model_type": "llava",
    "num_key_value_heads": 4,
    "vocab_size": 64000,
}


def test_the_original_checkpoint_is_refused(tmp_path):
    """The tower's config is in the vit/ folder, not config.json: without the refusal the
    llava family would read CLIPVisionConfig's defaults (a 224 px ViT-B/32)."""

    def edit(config):
        config.clear()
        config.update(ORIGINAL)

    with pytest.raises(MemspecError) as err:
        importer.import_spec(hf.edited_copy(FIX, tmp_path / "original", edit))
    text = err.value.render()
    assert "E713" in text and "mlp2x_gelu_Norm" in text and "BUAADreamer/Yi-VL-6B-hf" in text


@pytest.mark.parametrize(
    ("file", "edit", "words"),
    [
        ("config.json", lambda c: c["vision_config"].update(hidden_act="quick_gelu"), "exact GELU"),
        ("config.json", lambda c: c.update(projector_hidden_act="relu"), "GELU"),
        ("config.json", lambda c: c["text_config"].update(attention_dropout=0.1), "dropout"),
        ("config.json", lambda c: c.update(vision_feature_select_strategy="full"), "class token dropped"),
        ("preprocessor_config.json", lambda p: p["crop_size"].update(height=336, width=336), "position table"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, file, edit, words):
    with pytest.raises(MemspecError) as err:
        importer.import_spec(hf.edited_copy(FIX, tmp_path / "variant", edit, file=file))
    assert words in str(err.value)
