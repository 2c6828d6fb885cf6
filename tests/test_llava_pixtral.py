"""LLaVA with a Pixtral vision tower (llava_pixtral: mistral-community/pixtral-12b): the family is
chosen by vision_config.model_type over the llava family, the image positions follow
PixtralImageProcessor's resize with the patch as the unit (no merger), the measuring builder's
model and batch equal the spec, and the variants the formulas do not model are refused."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from processors import image_processing

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "pixtral-12b"
SPEC = ROOT / "specs" / "llava_pixtral" / "pixtral-12b.yaml"


def test_llava_with_a_pixtral_tower_imports_as_llava_pixtral():
    """model_type llava with vision_config.model_type pixtral is the llava_pixtral family (the
    llava family refused it: its tower is CLIP's); a CLIP llava stays llava."""
    imported = importer.import_spec(str(FIX))
    assert imported.family == "llava_pixtral"
    assert [m.type for m in imported.spec.modules] == ["pixtral_vision_tower", "mlp_projector", "llama_causal_lm"]
    assert sum(imported.header_parameters.values()) == 12_682_739_712
    assert importer.import_spec(str(ROOT / "tests" / "fixtures" / "hub" / "llava-1.5-7b-hf")).family == "llava"


@pytest.mark.parametrize(
    ("size", "grid"),
    [
        ((1024, 1024), (64, 64)),  # 1024 / 16 each way
        ((512, 384), (32, 24)),
        ((2048, 1536), (64, 48)),  # scaled to 1024 x 768 (longest edge 1024)
        ((1000, 500), (63, 32)),  # not scaled: ceil(62.5) x ceil(31.25)
        ((4000, 300), (64, 5)),  # 1024 x 76 -> 64 x ceil(4.75)
    ],
)
def test_image_positions_follow_the_processor(size, grid):
    """One [IMG] position per 16-px patch after the resize; the tower sees the same patches."""
    rows, cols = grid
    report = api.estimate(str(SPEC), micro_batch=1, seq_len=4608, images_per_sample=1, image_size=list(size))
    assert api.image_tokens_per_sample(report.nodes) == rows * cols
    tower = next(n for n in report.nodes if n.inst.path == "vision")
    assert tower.inst.scope["seq"] == rows * cols


def test_resize_equals_transformers():
    """The builder's resize (and so the family's) is PixtralImageProcessor's
    get_resize_output_image_size with the patch size, as PixtralProcessor calls it."""
    np = pytest.importorskip("numpy")
    get_resize_output_image_size = image_processing("pixtral", "get_resize_output_image_size")
    from compiler.measure.families import llava_pixtral

    config = llava_pixtral.load_config(FIX / "config.json")
    for h, w in [(1024, 1024), (512, 384), (2048, 1536), (1000, 500), (4000, 300), (1025, 7), (20, 20)]:
        expected = get_resize_output_image_size(np.zeros((h, w, 3)), size=(1024, 1024), patch_size=(16, 16))
        assert llava_pixtral.resized(config, h, w) == tuple(expected), (h, w)


def test_builder_counts_and_batch_equal_the_spec():
    """The measuring builder (picked by the tower's model_type) has the header's parameters per
    module, lm_head untied, and its batch the image's positions first."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for, llava_pixtral

    assert family_for(FIX / "config.json") is llava_pixtral
    config, model = hf.meta_build(llava_pixtral, FIX)
    assert model.lm_head.weight is not model.model.language_model.embed_tokens.weight
    counts = hf.module_counts(llava_pixtral, model)
    assert counts == importer.import_spec(str(FIX)).header_parameters
    batch = llava_pixtral.make_batch(
        config, {"experiment": "t", "micro_batch": 2, "seq_len": 4608, "images_per_sample": 1, "image_size": [2048, 1536]}, torch.bfloat16
    )
    assert tuple(batch["pixel_values"].shape) == (2, 3, 1024, 768)
    assert batch["image_sizes"].tolist() == [[1024, 768]] * 2
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [64 * 48] * 2
    assert (batch["labels"][:, : 64 * 49] == -100).all()


def test_default_image_fills_its_positions():
    """The default 1024 x 1024 image: 4096 [IMG] tokens, what seq_len is checked against."""
    with pytest.raises(MemspecError):
        api.estimate(str(SPEC), micro_batch=1, seq_len=4095, images_per_sample=1)
    api.estimate(str(SPEC), micro_batch=1, seq_len=64 * 65, images_per_sample=1)


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("vision_config", "hidden_act", "gelu", "SwiGLU"),
        ("text_config", "model_type", "llama", "Mistral"),
        ("text_config", "sliding_window", 4096, "sliding window"),
        ("", "vision_feature_layer", -2, "vision_feature_layer"),
        ("", "vision_feature_select_strategy", "default", "full"),
        ("", "multimodal_projector_bias", False, "biases"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    message = hf.refusal(FIX, tmp_path / "variant", where, key, value)
    assert words in message
