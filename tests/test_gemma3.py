"""Gemma 3 with images (the gemma3 family): the tower's patches, the projector's pooled tokens
and the language model's two materialised masks, worked by hand; the measuring builder's
batch against transformers' own block ids; the refused variants."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "gemma3" / "gemma-3-4b-it.yaml"
FIX = ROOT / "tests" / "fixtures" / "hub"


def _row(report, path: str):
    return next(r for r in report.rows if r.path == path)


def _dims(report, path: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", _row(report, path).dims)}


def test_the_tower_reads_4096_patches_and_the_text_256_tokens_per_image():
    report = api.estimate(str(SPEC), micro_batch=2, seq_len=2048, images_per_sample=1)
    assert _dims(report, "vision.patch_embedding")["b"] == 2
    assert _dims(report, "vision.patch_embedding")["s"] == 4096  # (896 / 14)^2
    assert _dims(report, "language.image_merge[0]")["image_tokens"] == 256  # pooled 64 x 64 -> 16 x 16
    assert api.image_tokens_per_sample(report.nodes) == 256


def test_the_projector_saves_its_norm_and_the_folded_input():
    # trained, the tower frozen: the fp32 normalised x (256 * 1152 * 4 = 1_179_648) and the
    # 16-bit [256, 1152] copy mm saves (589_824) per image; with the tower training also the
    # contiguous grid (4096 * 1152 * 2 = 9_437_184), x.float() (1_179_648), rstd (256 * 4) and
    # (1 + w) in fp32 (1152 * 4)
    frozen = api.estimate(str(SPEC), micro_batch=2, seq_len=2048, trainable=["projector", "language"])
    assert _row(frozen, "projector").activations == 2 * 1_769_472
    full = api.estimate(str(SPEC), micro_batch=2, seq_len=2048, trainable=["vision", "projector", "language"])
    assert _row(full, "projector").activations == 2 * (1_769_472 + 9_437_184 + 1_179_648 + 1024) + 4608


@pytest.mark.parametrize("attention, per_mask", [("sdpa", 1), ("eager", 2)])
def test_both_masks_are_materialised(attention, per_mask):
    """token_type_ids turn off sdpa's causal skip: the full and the sliding layers each get a
    [b, 1, s, s] mask, bool for sdpa, the compute dtype for eager, through the forward."""
    report = api.estimate(str(SPEC), micro_batch=2, seq_len=2048, attention=attention)
    assert _row(report, "language").transient_forward == 2 * 2 * 2048 * 2048 * per_mask


def test_the_builders_batch_marks_the_image_block_as_transformers_reads_it():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask

    from compiler.measure.families import gemma3

    config = gemma3.load_config(FIX / "gemma-3-4b-it" / "config.json")
    exp = {"experiment": "t", "micro_batch": 2, "seq_len": 300, "images_per_sample": 1}
    batch = gemma3.make_batch(config, exp, torch.bfloat16)
    assert batch["pixel_values"].shape == (2, 3, 896, 896)
    ids = get_block_sequence_ids_for_mask(batch["token_type_ids"])
    assert ids[:, :256].eq(0).all() and ids[:, 256:].eq(-1).all()  # one bidirectional block, then text
    assert (batch["input_ids"] == config.image_token_id).sum() == 2 * 256
    assert (batch["labels"][:, :256] == -100).all()


def _folder(tmp_path: Path, config: dict, processor: dict | None = None) -> str:
    folder = tmp_path / "model"
    hf.write_checkpoint(folder, config, hf.gemma3_tensors(hf.GEMMA_3_4B_IT), processor=processor)
    return str(folder)


@pytest.mark.parametrize(
    "config, processor, message",
    [
        (hf.GEMMA_3_4B_IT, {"do_pan_and_scan": True}, "pan and scan (do_pan_and_scan)"),
        ({**hf.GEMMA_3_4B_IT, "text_config": {**hf.GEMMA_3_4B_IT["text_config"], "final_logit_softcapping": 30}}, None, "soft-capping are not modelled"),
        (
            {**hf.GEMMA_3_4B_IT, "vision_config": {**hf.GEMMA_3_4B_IT["vision_config"], "vision_use_head": True}},
            None,
            "Gemma 3 reads the tower's last hidden state",
        ),
    ],
)
def test_variants_not_modelled_are_refused(tmp_path, config, processor, message):
    with pytest.raises(MemspecError) as exc:
        importer.import_spec(_folder(tmp_path, config, processor))
    err = exc.value.render()
    assert err.startswith("E713 ") and message in err, err


def test_released_processor_without_pan_and_scan_imports(tmp_path):
    imported = importer.import_spec(_folder(tmp_path, hf.GEMMA_3_4B_IT, {"do_pan_and_scan": None, "image_seq_length": 256}))
    assert imported.data["image_tokens"] == 256
    assert json.loads((tmp_path / "model" / "config.json").read_text())["mm_tokens_per_image"] == 256
