"""Llama 3.2 Vision (mllama: meta-llama/Llama-3.2-11B-Vision-Instruct): the family is chosen by
model_type, the tower's tiles and the cross-attention's vision positions follow the processor
(every image padded to max_image_tiles, whatever its size), the measuring builder's model and
batch equal the spec, and the variants the formulas do not model are refused."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "Llama-3.2-11B-Vision-Instruct"
SPEC = ROOT / "specs" / "mllama" / "llama-3.2-11b-vision-instruct.yaml"


def test_imports_as_mllama():
    imported = importer.import_spec(str(FIX))
    assert imported.family == "mllama"
    assert [m.type for m in imported.spec.modules] == ["mllama_vision_tower", "linear", "mllama_causal_lm"]
    assert sum(imported.header_parameters.values()) == 10_670_220_835


@pytest.mark.parametrize("size", [None, [560, 560], [560, 1120], [1680, 560], [300, 4000]])
def test_tiles_do_not_depend_on_the_image(size):
    """The processor pads every image to 4 tiles: the tower reads 4 x 1608 padded positions, the
    projector 4 x 1601, and the cross-attention layers attend to 6404 positions per image."""
    extra = {"image_size": size} if size else {}
    report = api.estimate(str(SPEC), micro_batch=2, seq_len=1024, images_per_sample=1, **extra)
    scopes = {n.inst.path: n.inst.scope for n in report.nodes}
    assert scopes["vision"]["batch"] == 2 and scopes["vision"]["seq"] == 4 * 1608
    assert scopes["projector"]["seq"] == 4 * 1601
    assert scopes["language"]["seq"] == 1024


def test_two_images_double_the_vision_positions():
    one = api.estimate(str(SPEC), micro_batch=1, seq_len=1024, images_per_sample=1)
    two = api.estimate(str(SPEC), micro_batch=1, seq_len=1024, images_per_sample=2)
    assert {n.inst.path: n.inst.scope["batch"] for n in two.nodes}["vision"] == 2
    # the cross-attention mask [b, 1, s, images x 6404] and the states [b, images x 6404, 4096] double
    assert two.allocated > one.allocated


def test_builder_counts_and_batch_equal_the_spec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for, mllama

    assert family_for(FIX / "config.json") is mllama
    config, model = hf.meta_build(mllama, FIX)
    counts = hf.module_counts(mllama, model)
    assert counts == importer.import_spec(str(FIX)).header_parameters
    exp = {"experiment": "t", "micro_batch": 2, "seq_len": 2048, "images_per_sample": 1, "image_size": [560, 1120]}
    batch = mllama.make_batch(config, exp, torch.bfloat16)
    assert tuple(batch["pixel_values"].shape) == (2, 1, 4, 3, 560, 560)
    assert mllama.tile_grid(config, [560, 1120]) == (1, 2)
    assert batch["aspect_ratio_ids"].tolist() == [[2], [2]]  # (1, 2) is the second supported ratio
    assert batch["aspect_ratio_mask"].tolist() == [[[1, 1, 0, 0]]] * 2
    assert tuple(batch["cross_attention_mask"].shape) == (2, 2048, 1, 4)
    assert batch["cross_attention_mask"].sum().item() == 2 * 2048 * 2
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [1, 1]


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("vision_config", "hidden_act", "quick_gelu", "GELU"),
        ("text_config", "hidden_act", "gelu", "silu"),
        ("text_config", "tie_word_embeddings", True, "tied"),
        ("text_config", "dropout", 0.1, "dropout"),
        ("text_config", "cross_attention_layers", [3, 8, 12, 18], "every period-th layer"),
        ("text_config", "num_hidden_layers", 42, "every period-th layer"),
        ("vision_config", "vision_output_dim", 7000, "vision_output_dim"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    def edit(config):
        config[where][key] = value

    with pytest.raises(MemspecError) as err:
        importer.import_spec(hf.edited_copy(FIX, tmp_path / "variant", edit))
    assert words in str(err.value)
