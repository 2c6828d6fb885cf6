"""An older transformers release named by the experiment (`versions: {transformers: X}`,
--transformers-version): the formulas follow its loss, measured on the records of
specs/matrices/transformers-versions.yaml; releases and setups not measured are refused."""

import json
from pathlib import Path

import pytest

from compiler.api import estimate
from compiler.cli import main
from compiler.errors import MemspecError
from compiler.measure.experiment import ExperimentError, check_measurable, load_experiment
from compiler.pipeline.resolve import TRANSFORMERS, release_code, release_text

ROOT = Path(__file__).resolve().parent.parent
LLAMA = str(ROOT / "specs" / "llama" / "llama-2-7b.yaml")
RECORDS = sorted((ROOT / "tests" / "measured" / "cpu-trace").glob("transformers-versions_*.json"))


def _lora(**kw):
    kw = {"attention": "sdpa", **kw}
    return estimate(LLAMA, micro_batch=4, seq_len=2048, images_per_sample=0, trainable=[], gradient_checkpointing=["language"], lora={"r": 16}, **kw)


@pytest.mark.parametrize(
    "text, code",
    [("4.46.3", 4_046_003), ("4.44", 4_044_000), ("5.23.0", 5_023_000), ("4.57.0.dev0", 4_057_000), ("5.0.0rc1", 5_000_000), ("4", None), ("banana", None)],
)
def test_release_codes(text, code):
    assert release_code(text) == code


def test_the_default_is_the_pinned_release():
    assert release_text(TRANSFORMERS) == "5.23.0"
    assert _lora().setup.transformers == TRANSFORMERS


def test_each_release_band_has_its_loss():
    pinned, t444, t446, t457 = (_lora(**({"versions": {"transformers": v}} if v else {})) for v in (None, "4.44.2", "4.46.3", "4.57.1"))
    # 4.49 on pads the labels as 5.x does; the loss is the same (the 4.x rotary table has one
    # buffer, not two: 512 B less)
    assert t457.tensors == pinned.tensors - 512
    # 4.46 to 4.48: the 16-bit logits [4, 2048, 32000] stay beside the fp32 copy and its shifted
    # copy: the loss's forward is the peak and above 4.43 to 4.45's, where the 16-bit logits die
    assert t446.estimate.peak.phase == "forward" and t446.estimate.peak.path == "language.loss"
    assert t446.tensors - t444.tensors == 4 * 2048 * 32000 * 2 == 524_288_000
    assert t444.tensors > pinned.tensors


# From 4.49 on the peak is the loss's backward, where causal_lm_loss charges nll_loss's saved
# targets a little long (its NB): [4, 2048] int64 65_536 B and their 512-B block
TARGETS = 4 * 2048 * 8 + 512


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_the_traced_releases_are_reproduced(path):
    """Each record, traced with its release installed: at or above the trace by one 512-B block
    (a buffer the tracer and the formulas place apart) before 4.49, by the saved targets from 4.49 on."""
    rec = json.loads(path.read_text())
    assert rec["versions"]["transformers"] == rec["experiment"]["versions"]["transformers"]
    exp = dict(rec["experiment"])
    r = estimate(str(ROOT / exp.pop("model")), **{k: v for k, v in exp.items() if k != "experiment"})
    over = TARGETS if release_code(rec["versions"]["transformers"]) >= 4_049_000 else 512
    assert r.tensors - rec["allocated"] == over


def test_the_matrix_covers_three_releases_on_two_models():
    names = {p.stem for p in RECORDS}
    assert {n.rsplit("_", 1)[1] for n in names} == {"tf4.44.2", "tf4.46.3", "tf4.57.1"}
    assert len(names) == 12


@pytest.mark.parametrize(
    "versions, text",
    [
        ({"transformers": "banana"}, "versions.transformers 'banana' is not a release"),
        ({"transformers": "4.37.2"}, "transformers 4.37.2 is not modelled: releases before 4.43 make the rotary cos and sin in every attention layer"),
    ],
)
def test_unmodelled_releases_are_refused(versions, text):
    with pytest.raises(MemspecError) as err:
        _lora(versions=versions)
    assert "E331" in err.value.render() and text in err.value.render()


def test_older_releases_are_refused_beyond_a_plain_sdpa_step():
    with pytest.raises(MemspecError) as err:
        _lora(versions={"transformers": "4.46.3"}, attention="eager")
    assert "E331" in err.value.render() and "not with eager attention" in err.value.render()
    # a multimodal model: the vision formulas list no older release (LlavaForConditionalGeneration
    # of those releases merges the image features otherwise)
    with pytest.raises(MemspecError) as err:
        estimate(str(ROOT / "specs" / "llava" / "llava-1.5-7b.yaml"), micro_batch=1, seq_len=2048, versions={"transformers": "4.46.3"})
    assert "E331" in err.value.render() and "does not list older_transformers under setups" in err.value.render()


def test_the_flag_and_the_setup_line(capsys):
    args = ["estimate", LLAMA, "--micro-batch", "4", "--seq-len", "2048", "--lora-r", "16"]
    assert main(args + ["--transformers-version", "4.46.3", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["versions"] == {"transformers": "4.46.3"}
    assert main(args + ["--transformers-version", "4.46.3"]) == 0
    assert "| transformers 4.46.3" in capsys.readouterr().out
    assert main(args + ["--transformers-version", "4.40"]) == 2  # a flag's problem is the command line's
    assert "E331 --transformers-version: transformers 4.40.0 is not modelled" in capsys.readouterr().err


def test_measuring_refuses_a_release_other_than_the_installed_one(tmp_path):
    exp = tmp_path / "e.yaml"
    exp.write_text(
        f"experiment: e\nmodel: {LLAMA}\nmicro_batch: 1\nseq_len: 64\nimages_per_sample: 0\ntrainable: [language]\nversions: {{transformers: '0.0.1'}}\n"
    )
    with pytest.raises(ExperimentError, match="names transformers 0.0.1; .* is installed"):
        check_measurable(load_experiment(exp))
