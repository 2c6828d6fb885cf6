"""Mistral 3 (mistral3): the processor's resize and image positions the family derives against
transformers' PixtralImageProcessor and the measuring builder's batch, the parameters per
module against Mistral3ForConditionalGeneration, and the variants refused."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer
from processors import image_processing

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "Mistral-Small-3.1-24B-Instruct-2503"
SPEC = ROOT / "specs" / "mistral3" / "mistral-small-3.1-24b-instruct.yaml"


def _rows(report, prefix: str) -> list:
    return [r for r in report.rows if r.path.startswith(prefix)]


@pytest.mark.parametrize(
    ("size", "merged"),
    [
        ((1024, 1024), (37, 37)),  # ceil(1024 / 28) = 37 each way
        ((768, 1024), (28, 37)),  # 768 / 28 = 27.4 -> 28
        ((2048, 1536), (55, 42)),  # scaled to 1540 x 1155 (longest edge 1540), then 55 x ceil(41.25)
        ((1540, 1540), (55, 55)),  # at the edge: not scaled
        ((4000, 300), (55, 5)),  # 1540 x 115 -> 55 x ceil(4.1)
        ((20, 20), (1, 1)),  # a small image is not scaled up: one merged token
    ],
)
def test_image_positions_follow_the_processor(size, merged):
    """The language model merges rows x cols features per image ([IMG] positions); the tower
    sees 2 x 2 patches per feature."""
    rows, cols = merged
    report = api.estimate(str(SPEC), micro_batch=1, seq_len=4096, images_per_sample=1, image_size=list(size))
    assert api.image_tokens_per_sample(report.nodes) == rows * cols
    tower = next(n for n in report.nodes if n.inst.path == "vision")
    assert tower.inst.scope["seq"] == 4 * rows * cols


def test_resize_equals_transformers():
    """The builder's resize (and so the family's) is PixtralImageProcessor's
    get_resize_output_image_size with patch x merge, as PixtralProcessor calls it."""
    np = pytest.importorskip("numpy")
    get_resize_output_image_size = image_processing("pixtral", "get_resize_output_image_size")
    from compiler.measure.families import mistral3

    config = mistral3.load_config(FIX / "config.json")
    for h, w in [(1024, 1024), (768, 1024), (2048, 1536), (1540, 1540), (4000, 300), (20, 20), (1541, 7), (3079, 3080)]:
        expected = get_resize_output_image_size(np.zeros((h, w, 3)), size=(1540, 1540), patch_size=(28, 28))
        assert mistral3.resized(config, h, w) == tuple(expected), (h, w)


def test_default_image_fills_its_positions():
    """The spec's default 1024 x 1024 image brings 37 x 37 [IMG] tokens (image_tokens, what
    seq_len is checked against); the processor's 37 [IMG_BREAK] / [IMG_END] are text."""
    spec = importer.import_spec(str(FIX)).spec
    assert spec.image_tokens == 37 * 37
    with pytest.raises(MemspecError):
        api.estimate(str(SPEC), micro_batch=1, seq_len=37 * 37 - 1, images_per_sample=1)
    api.estimate(str(SPEC), micro_batch=1, seq_len=37 * 38, images_per_sample=1)


def test_frozen_tower_saves_nothing_and_peft_checkpointing_makes_it_save():
    """Frozen and no gradient asked of it: the tower's layers save nothing. With LoRA and
    checkpointing, enable_input_require_grads() hooks patch_conv (PixtralVisionModel's input
    embeddings), so the frozen layers save for the input gradient; the shared block-diagonal
    mask (5476^2 x 2 B at 1024 x 1024) is charged once."""
    frozen = api.estimate(str(SPEC), micro_batch=1, seq_len=2048, images_per_sample=1, trainable=["projector", "language"])
    assert sum(r.activations or 0 for r in _rows(frozen, "vision")) == 0
    lora = api.estimate(
        str(SPEC),
        micro_batch=1,
        seq_len=2048,
        images_per_sample=1,
        trainable=["projector"],
        lora={"r": 16, "alpha": 16, "modules": ["language"], "target_modules": "all-linear"},
        gradient_checkpointing=["language"],
    )
    assert next(r for r in lora.rows if r.path == "vision").activations == 5476 * 5476 * 2 + 5476 * 1024 * 2
    assert sum(r.activations or 0 for r in _rows(lora, "vision.layers")) > 0


def test_builder_counts_and_batch_equal_the_spec():
    """The measuring builder's model (on the meta device) has the header's parameters per module,
    lm_head untied as from_pretrained leaves it, and its batch the image's positions first."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import mistral3

    config, model = hf.meta_build(mistral3, FIX)
    assert not config.tie_word_embeddings
    counts = hf.module_counts(mistral3, model)
    assert counts == importer.import_spec(str(FIX)).header_parameters
    batch = mistral3.make_batch(
        config, {"experiment": "t", "micro_batch": 2, "seq_len": 4096, "images_per_sample": 1, "image_size": [2048, 1536]}, torch.bfloat16
    )
    assert tuple(batch["pixel_values"].shape) == (2, 3, 1540, 1176)
    assert batch["image_sizes"].tolist() == [[1540, 1176]] * 2
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [55 * 42] * 2
    assert (batch["input_ids"] == mistral3.IMG_BREAK_ID).sum(dim=1).tolist() == [54] * 2
    assert (batch["labels"][:, : 55 * 43] == -100).all()


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("vision_config", "hidden_act", "gelu", "SwiGLU"),
        ("text_config", "model_type", "ministral3", "Ministral"),
        ("text_config", "sliding_window", 4096, "sliding window"),
        ("", "vision_feature_layer", [-1, -2], "vision_feature_layer"),
        ("", "projector_hidden_act", "silu", "GELU"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    message = hf.refusal(FIX, tmp_path / "variant", where, key, value)
    assert words in message
