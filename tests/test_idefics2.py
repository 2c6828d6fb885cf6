"""Idefics2 (idefics2: HuggingFaceM4/idefics2-8b-base): the import and its parameter counts, the
patches per image after Idefics2ImageProcessor's resize (the spec's integer expression against the
processor's own get_resize_output_image_size) in the tower and connector contexts, the connector's
rows in an estimate, the measuring builder's model and batch against the spec, and the variants the
formulas do not model refused (image splitting among them)."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "idefics2-8b-base"
SPEC = ROOT / "specs" / "idefics2" / "idefics2-8b-base.yaml"
PATCH, LATENTS = 14, 64

# vision (SigLIP so400m/14 at 980, no head): patch conv 3 * 14 * 14 * 1152 + 1152 = 678_528, positions
#   4900 * 1152 = 5_644_800, 27 * 15_239_504 layers, post-LN 2304
# connector: modality projection gate, up 2 * 1152 * 14336 + down 14336 * 4096 = 91_750_400; latents
#   64 * 4096 = 262_144; 3 resampler layers of 217_067_520 (3 norms, q, o 2 * 4096 * 1536, k, v 2 * 4096 * 384,
#   MLP 3 * 4096 * 16384); final norm 4096
# language (Mistral-7B, vocab 32003, untied): 2 * 32003 * 4096 + 32 * 218_112_000 layers + norm 4096
COUNTS = {"vision": 417_792_240, "projector": 743_219_200, "language": 7_241_756_672}

SIZES = [(980, 980), (640, 480), (480, 640), (1960, 980), (980, 1960), (300, 200), (2000, 1000), (1080, 1920), (4000, 300), (500, 510), (1024, 768), (378, 378)]


def processor_patches(height: int, width: int) -> int:
    """Patches of one image after Idefics2ImageProcessor's resize (transformers' own
    get_resize_output_image_size, the PIL backend's, which needs no torchvision)."""
    np = pytest.importorskip("numpy")
    pil = pytest.importorskip("transformers.models.idefics2.image_processing_pil_idefics2")
    from transformers.image_utils import SizeDict

    h, w = pil.get_resize_output_image_size(np.zeros((3, height, width)), SizeDict(shortest_edge=378, longest_edge=980))
    return (h // PATCH) * (w // PATCH)


def test_imports_as_idefics2_with_the_published_count():
    assert hf.imported_counts(FIX, "idefics2") == COUNTS
    assert sum(COUNTS.values()) == 8_402_768_112  # the published 8.4B


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(FIX)).spec
    assert hf.modules(written) == hf.modules(imported)


@pytest.mark.parametrize("size", SIZES)
def test_contexts_count_the_processors_patches(size):
    h, w = size
    want = processor_patches(h, w)
    assert hf.contexts(api.load_spec(SPEC), h, w, micro_batch=2) == {"vision": (2, want), "projector": (2, want)}


def test_without_a_size_the_image_is_square_at_the_longest_edge():
    spec = api.load_spec(SPEC)
    vision = next(m for m in spec.modules if m.name == "vision")
    scope = {"micro_batch": 1, "images_per_sample": 1, "image_h": 0, "image_w": 0, "seq_len": 4096}
    assert vision.seq({**scope, **vision.inputs}) == 70 * 70


def test_the_connector_rows():
    """980 x 980: 4900 patches; trained, the modality projection saves its SwiGLU's [4900, 14336]
    tensors, every resampler layer its context norm's fp32 copy and the concatenated keys' input;
    64 image positions reach the text model."""
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=1024, image_size=[980, 980], trainable=["projector"])
    rows = {r.path: r for r in est.rows}
    patches = 4900
    assert rows["projector.mul"].activations == 2 * patches * 14336 * 2
    assert rows["projector.layers[0:3].input_context_norm"].activations == patches * 4096 * (4 + 2) + patches * 4
    assert rows["projector.layers[0:3].k_proj"].activations == (patches + LATENTS) * 4096 * 2
    assert rows["language.image_merge[0]"].activations == 1024  # the bool mask [1, 1024, 1]


def test_builder_counts_and_batch_equal_the_spec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for, idefics2

    assert family_for(FIX / "config.json") is idefics2
    config, model = hf.meta_build(idefics2, FIX)
    counts = hf.module_counts(idefics2, model)
    assert counts == COUNTS
    for size in SIZES:
        h, w = idefics2.resized(config, list(size))
        assert (h // PATCH) * (w // PATCH) == processor_patches(*size)
    batch = idefics2.make_batch(
        config, {"experiment": "t", "micro_batch": 2, "seq_len": 1024, "images_per_sample": 1, "image_size": [640, 480]}, torch.bfloat16
    )
    assert tuple(batch["pixel_values"].shape) == (2, 1, 3, 640, 480)
    assert tuple(batch["pixel_attention_mask"].shape) == (2, 1, 640, 480)
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [LATENTS] * 2


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("text_config", "model_type", "llama", "Mistral"),
        ("vision_config", "hidden_act", "gelu", "gelu_pytorch_tanh"),
        ("perceiver_config", "hidden_act", "gelu", "SwiGLU"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    message = hf.refusal(FIX, tmp_path / "variant", where, key, value)
    assert words in message


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("do_image_splitting", True, "do_image_splitting"),
        ("size", {"longest_edge": 1400, "shortest_edge": 378}, "position table"),
    ],
)
def test_other_processor_settings_are_refused(tmp_path, key, value, words):
    assert words in hf.refusal(FIX, tmp_path / "variant", "", key, value, "preprocessor_config.json")
