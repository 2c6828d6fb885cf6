"""BLIP-2 with an OPT language model (blip_2: Salesforce/blip2-opt-2.7b): the import and its
parameter counts, the measuring builder's model and batch against the spec, the image positions
in the language model, the frozen tower's autograd under peft with checkpointing, and the variants
the formulas do not model (the Flan-T5 language model among them) refused."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "blip2-opt-2.7b"
SPEC = ROOT / "specs" / "blip_2" / "blip2-opt-2.7b.yaml"
QUERIES = 32

# vision (EVA ViT-g/14 at 224): patch conv 3 * 14 * 14 * 1408 + 1408 = 829_312, class token and 257
#   positions 1408 + 257 * 1408 = 363_264, 39 * 25_250_176 layers (qkv 1408 * 4224 + 4224, projection
#   1408^2 + 1408, fc1 1408 * 6144 + 6144, fc2 6144 * 1408 + 1408, two LayerNorms 4 * 1408), post-LN 2816
# qformer: query_tokens 32 * 768 = 24_576, LayerNorm 1536, 6 layers with cross-attention 10_434_816
#   (self 4 * (768^2 + 768) + 1536, cross 2 * (768^2 + 768) + 2 * (1408 * 768 + 768) + 1536, intermediate_query
#   768 * 3072 + 3072, output_query 3072 * 768 + 768 + 1536) and 6 without 7_087_872
# projector: 768 * 2560 + 2560
# language (OPT-2.7B, vocab 50304): the tied table 50304 * 2560 = 128_778_240, positions 2050 * 2560 =
#   5_248_000, 32 * 78_676_480 layers, final LayerNorm 5120
COUNTS = {"vision": 985_952_256, "qformer": 105_162_240, "projector": 1_968_640, "language": 2_651_678_720}


def test_imports_as_blip_2_with_the_published_count():
    assert hf.imported_counts(FIX, "blip_2") == COUNTS
    assert sum(COUNTS.values()) == 3_744_761_856
    # the checkpoint also stores the tied head (language_model.lm_head.weight), which the hub's 3.87B counts
    assert sum(COUNTS.values()) + 50304 * 2560 == 3_873_540_096


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(FIX)).spec
    assert hf.modules(written) == hf.modules(imported)


def test_builder_counts_and_batch_equal_the_spec():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import blip_2, family_for

    assert family_for(FIX / "config.json") is blip_2  # model_type "blip-2"
    config, model = hf.meta_build(blip_2, FIX)
    counts = hf.module_counts(blip_2, model)
    assert counts == COUNTS
    batch = blip_2.make_batch(config, {"experiment": "t", "micro_batch": 2, "seq_len": 256, "images_per_sample": 1}, torch.bfloat16)
    assert tuple(batch["pixel_values"].shape) == (2, 3, 224, 224)
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [QUERIES] * 2


def test_image_positions_and_the_towers_autograd():
    """Micro-batch 2, seq 256: the 32 query outputs are scattered into the text (image_merge); the
    frozen tower saves nothing, unless peft's input-grad hook (LoRA with checkpointing) makes its
    embeddings' output a leaf that requires grad: then every layer saves what its input gradient
    needs, and the embeddings' output is kept [2, 257, 1408]."""
    plain = {r.path: r for r in api.estimate(str(SPEC), micro_batch=2, seq_len=256, images_per_sample=1, lora={"r": 16}).rows}
    assert plain["language.image_merge[0]"].count == 1
    assert sum(r.activations or 0 for p, r in plain.items() if p.startswith("vision.")) == 0
    hooked = {
        r.path: r for r in api.estimate(str(SPEC), micro_batch=2, seq_len=256, images_per_sample=1, lora={"r": 16}, gradient_checkpointing=["language"]).rows
    }
    assert hooked["vision.embeddings_kept[0]"].activations == 2 * 257 * 1408 * 2
    assert hooked["vision.layers[0:39].mlp.activation_fn"].activations == 2 * 257 * 6144 * 2  # gelu saves fc1's output


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("text_config", "model_type", "t5", "Flan-T5"),
        (None, "use_decoder_only_language_model", False, "Flan-T5"),
        ("qformer_config", "cross_attention_frequency", 1, "cross_attention_frequency"),
        ("qformer_config", "use_qformer_text_input", True, "text feed-forward"),
        ("vision_config", "hidden_act", "quick_gelu", "exact GELU"),
        ("text_config", "do_layer_norm_before", False, "LayerNorm first"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, where, key, value, words):
    message = hf.refusal(FIX, tmp_path / "variant", where, key, value)
    assert "E713" in message and words in message
