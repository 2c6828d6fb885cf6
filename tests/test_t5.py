"""T5 / Flan-T5 (t5: T5ForConditionalGeneration), memspec's encoder-decoder family: each checked-in
spec is what `memspec import` writes from its fixture and counts what transformers builds, the
encoder runs over seq_len and the decoder over the experiment's target_len (cross-attention's k
and v over seq_len), target_len is refused for a decoder-only model (E333), the measuring
builder's batch has both lengths, and the variants the formulas do not model are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.cli import main
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "specs" / "t5" / "flan-t5-base.yaml"

# (fixture, checked-in spec, parameters): the arithmetic is in tests/test_import.py
MODELS = [
    ("flan-t5-base", "specs/t5/flan-t5-base.yaml", 222_903_552),
    ("flan-t5-large", "specs/t5/flan-t5-large.yaml", 750_251_008),
    ("flan-t5-xl", "specs/t5/flan-t5-xl.yaml", 2_783_959_040),
    ("t5-base", "specs/t5/t5-base.yaml", 222_903_552),
]


@pytest.mark.parametrize("fixture, spec, parameters", MODELS)
def test_the_checked_in_spec_is_what_import_writes(fixture, spec, parameters):
    written = api.load_spec(ROOT / spec)
    imported = importer.import_spec(str(hf.FIXTURES / fixture)).spec
    assert hf.modules(written) == hf.modules(imported)
    assert written.encoder_decoder and imported.encoder_decoder
    assert sum(m.parameters for m in written.modules) == parameters


@pytest.mark.parametrize("fixture, spec, parameters", MODELS)
def test_parameters_are_what_transformers_builds(fixture, spec, parameters):
    """transformers 5 ties lm_head to the shared table (T5Config forces tie_word_embeddings), so
    Flan-T5's 247_577_856 published parameters are 222_903_552 tensors in the model."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for

    config_path = hf.FIXTURES / fixture / "config.json"
    family = family_for(config_path)
    with torch.device("meta"):
        model = family.model_class()._from_config(family.load_config(config_path))
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert model.lm_head.weight is model.shared.weight


def _seqs(report) -> dict[str, int]:
    return {n.inst.path: n.inst.scope["seq"] for r in report.nodes for n in r.walk()}


def test_the_encoder_reads_seq_len_the_decoder_target_len():
    seqs = _seqs(api.estimate(str(BASE), micro_batch=2, seq_len=512, target_len=96))
    assert seqs["language.encoder.block[3].self_attention.q"] == 512
    assert seqs["language.decoder.block[3].self_attention.q"] == 96
    assert seqs["language.decoder.block[3].cross_attention.q"] == 96
    assert seqs["language.decoder.block[3].cross_attention.k"] == 512  # the encoder output
    assert seqs["language.decoder.block[3].cross_attention.core"] == 96
    assert seqs["language.lm_head"] == seqs["language.loss"] == 96


def test_target_len_defaults_to_run_summarization_s():
    assert _seqs(api.estimate(str(BASE), micro_batch=1, seq_len=512))["language.loss"] == 128


def test_a_longer_target_costs_more():
    short = api.estimate(str(BASE), micro_batch=8, seq_len=512, target_len=128).allocated
    long = api.estimate(str(BASE), micro_batch=8, seq_len=512, target_len=256).allocated
    assert long > short


def test_target_len_is_refused_for_a_decoder_only_model():
    with pytest.raises(MemspecError) as exc:
        api.estimate(str(ROOT / "specs" / "olmo2" / "OLMo-2-0425-1B.yaml"), micro_batch=1, seq_len=1024, target_len=128)
    assert [d.code for d in exc.value.diagnostics] == ["E333"]
    assert "no encoder-decoder" in exc.value.diagnostics[0].message


def test_target_len_in_an_experiment_file_is_located(tmp_path, capsys):
    exp = tmp_path / "olmo.yaml"
    exp.write_text(f"experiment: olmo\nmodel: {ROOT / 'specs/olmo2/OLMo-2-0425-1B.yaml'}\nmicro_batch: 1\nseq_len: 1024\ntarget_len: 128\n")
    assert main(["estimate", str(exp)]) == 1
    err = capsys.readouterr().err
    assert f"{exp}:5:" in err and "E333 $.target_len" in err and "help: leave target_len out" in err


def test_lora_on_q_and_v_adapts_every_attention():
    """peft's target_modules [q, v] match the self-attention's and the cross-attention's q and v."""
    report = api.estimate(
        str(BASE), micro_batch=1, seq_len=256, target_len=64, trainable=[], lora={"r": 16, "alpha": 32, "target_modules": ["q", "v"], "modules": ["language"]}
    )
    adapted = [n.inst.path for r in report.nodes for n in r.walk() if n.inst.formula.layer_type == "lora_linear"]
    assert len(adapted) == 2 * (12 + 12 + 12)  # encoder self, decoder self and cross
    assert all(p.endswith((".q", ".v")) for p in adapted)


def test_the_builder_batch_has_both_lengths():
    pytest.importorskip("torch")
    from compiler.measure.families import t5

    batch = t5.make_batch(None, {"experiment": "x", "micro_batch": 3, "seq_len": 64, "target_len": 16, "images_per_sample": 0}, None)
    assert tuple(batch["input_ids"].shape) == (3, 64)
    assert tuple(batch["labels"].shape) == (3, 16)


@pytest.mark.parametrize(
    "edit, code",
    [
        (lambda c: c.update(feed_forward_proj="gated-silu"), "E713"),  # UMT5-style gated SiLU: no formula
        (lambda c: c.update(dropout_rate=0.0), "E713"),
    ],
)
def test_unmodelled_variants_are_refused(tmp_path, edit, code):
    folder = hf.edited_copy(hf.FIXTURES / "flan-t5-base", tmp_path / "variant", edit)
    with pytest.raises(MemspecError) as exc:
        importer.import_spec(folder)
    assert exc.value.diagnostics[0].code == code


def test_flash_attention_is_refused():
    with pytest.raises(MemspecError) as exc:
        api.estimate(str(BASE), micro_batch=1, seq_len=512, attention="flash_attention_2")
    assert [d.code for d in exc.value.diagnostics] == ["E714"]


def test_the_setup_line_names_both_sequences():
    from compiler.pipeline.render import setup_line

    line = setup_line(api.estimate(str(BASE), micro_batch=2, seq_len=512, target_len=96))
    assert "| source 512, target 96 |" in line
