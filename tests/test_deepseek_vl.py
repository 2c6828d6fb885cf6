"""DeepSeek-VL (deepseek_vl): the image tokens and parameters the family derives against the
measuring builder's (transformers' DeepseekVLForConditionalGeneration), the SigLIP head that
runs but reaches no loss, and the hybrid 7B refused by name."""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "hub" / "deepseek-vl-1.3b-chat"
SPEC = ROOT / "specs" / "deepseek_vl" / "deepseek-vl-1.3b-chat.yaml"


def _row(report, path: str):
    return next(r for r in report.rows if r.path == path)


def test_image_tokens_are_the_patch_grid():
    # (384 / 16)^2 = 576, DeepseekVLProcessor's num_image_tokens
    spec = importer.import_spec(str(FIX)).spec
    report = api.estimate(str(SPEC), micro_batch=2, seq_len=1024, images_per_sample=1)
    assert api.image_tokens_per_sample(report.nodes) == 576
    assert spec.image_tokens == 576


def test_head_parameters_are_counted_but_get_no_gradient():
    """The attention-pooling head (12_595_200 parameters: probe 1024, in_proj 3 * 1024^2 + 3072,
    out_proj 1024^2 + 1024, LN 2048, MLP 2 * 1024 * 4096 + 4096 + 1024) is in the tower's
    parameters; trained, the tower's gradients leave it out: DeepseekVLModel.get_image_features
    overwrites its pooled output with the aligner's. bf16-mixed with 16-bit weights is
    DeepSpeed's flat fp32 partition, which holds the master weight and both moments of every
    parameter that requires grad, reached or not (12 bytes each)."""
    report = api.estimate(
        str(SPEC), micro_batch=1, seq_len=1024, images_per_sample=1, trainable=["vision", "projector", "language"], precision="bf16-mixed", dp=1, zero=0
    )
    head = [r for r in report.rows if r.path.startswith("vision.head[0]")]
    assert sum(r.parameters for r in head) == 12_595_200 * 2  # bf16 weights
    assert sum(r.gradients for r in head) == 0
    assert sum(r.optimizer_states for r in head) == 12_595_200 * 12
    assert _row(report, "vision.post_layernorm").gradients == 2 * 1024 * 2


def test_hybrid_is_refused_by_name(tmp_path):
    folder = hf.edited_copy(FIX, tmp_path / "deepseek-vl-7b-chat", lambda config: config.update(model_type="deepseek_vl_hybrid"))
    with pytest.raises(MemspecError) as err:
        importer.import_spec(folder)
    assert "E713" in str(err.value) and "SAM" in str(err.value)


def test_builder_counts_and_batch_equal_the_spec():
    """The measuring builder's model (on the meta device) has the header's parameters per module,
    and its batch the spec's image tokens first in every sample."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import deepseek_vl

    config, model = hf.meta_build(deepseek_vl, FIX)
    counts = hf.module_counts(deepseek_vl, model)
    assert counts == importer.import_spec(str(FIX)).header_parameters
    assert not config.tie_word_embeddings
    batch = deepseek_vl.make_batch(config, {"experiment": "t", "micro_batch": 2, "seq_len": 1024, "images_per_sample": 1}, torch.bfloat16)
    assert tuple(batch["pixel_values"].shape) == (2, 3, 384, 384)
    assert (batch["input_ids"] == config.image_token_id).sum(dim=1).tolist() == [576, 576]
    assert (batch["labels"][:, :576] == -100).all()
