"""`memspec measure` end to end on tiny LLaVAs, against committed expected records (the
finetune step with fp32 master weights and under autocast, the pretrain step, the tower
alone trained)."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="measuring needs torch")
pytest.importorskip("transformers", reason="measuring needs transformers")

from compiler.measure import record  # noqa: E402
from compiler.measure.__main__ import run  # noqa: E402

TINY = Path(__file__).parent / "measured" / "tiny"
# What the harness decides; versions and the machine may differ between runs.
COMPARED = ("schema", "name", "experiment", "model_config_sha256", "source", "emulation", "steps", "allocated", "allocated_first_step", "reserved", "device")


@pytest.mark.parametrize("name", ["tiny-finetune", "tiny-pretrain", "tiny-autocast", "tiny-vision"])
def test_cli_reproduces_the_committed_record(name, tmp_path):
    out = tmp_path / f"{name}.json"
    assert run([str(TINY / f"{name}.yaml"), "--steps", "3", "-o", str(out)]) == 0
    measured = record.read_record(out)
    expected = record.read_record(TINY / "expected" / f"{name}.json")
    assert record.validate(measured) == []
    assert {k: measured[k] for k in COMPARED} == {k: expected[k] for k in COMPARED}


def test_overrides_rename_the_record(tmp_path):
    out = tmp_path / "r.json"
    argv = [str(TINY / "tiny-pretrain.yaml"), "--micro-batch", "1", "--seq-len", "32", "--gradient-checkpointing", "language", "-o", str(out)]
    assert run(argv) == 0
    measured = json.loads(out.read_text())
    assert measured["name"] == "tiny-pretrain_b1_s32_language"
    assert (measured["experiment"]["micro_batch"], measured["experiment"]["seq_len"]) == (1, 32)
    assert measured["experiment"]["gradient_checkpointing"] == ["language"]


def test_alloc_conf_names_the_record_and_the_replay_takes_it(tmp_path, capsys):
    """--alloc-conf: the record's name ends in the settings, its experiment keeps them, and the
    emulated allocator replays the step under them: expandable segments reserve four 20 MiB
    pages of the large pool and one 2 MiB page of the small, 82 MiB. A value torch refuses is
    an input error naming the key."""
    out = tmp_path / "r.json"
    argv = [str(TINY / "tiny-pretrain.yaml"), "--micro-batch", "1", "--seq-len", "32", "--alloc-conf", "expandable_segments:True", "-o", str(out)]
    assert run(argv) == 0
    measured = json.loads(out.read_text())
    assert measured["name"] == "tiny-pretrain_b1_s32_expandable_segments-True"
    assert (measured["experiment"]["alloc_conf"], measured["reserved"]) == ("expandable_segments:True", 82 * 2**20)
    assert run([str(TINY / "tiny-pretrain.yaml"), "--alloc-conf", "expandable_segments:yes", "-o", str(out)]) == 1
    assert "alloc_conf: expandable_segments" in capsys.readouterr().err


def test_alloc_conf_applies_to_every_entry_of_a_matrix(tmp_path):
    """--alloc-conf with --matrix: each entry runs under the settings and its name ends in them,
    so the records sit beside the same matrix's records under torch's defaults."""
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f"matrix: m\nbase: {{model: {TINY / 'tiny-llava.yaml'}, seq_len: 48, trainable: [projector]}}\naxes: {{micro_batch: [1]}}\n")
    assert run(["--matrix", str(matrix), "-o", str(tmp_path / "out"), "--alloc-conf", "expandable_segments:True"]) == 0
    (path,) = (tmp_path / "out").glob("*.json")
    assert path.name == "m_b1_expandable_segments-True.json"
    assert json.loads(path.read_text())["experiment"]["alloc_conf"] == "expandable_segments:True"


def test_a_present_record_of_another_experiment_is_named_not_skipped(tmp_path, capsys):
    """A matrix measured again skips the entries whose records are present; one whose record
    measured another experiment (the matrix or expand_matrix changed since) is said to, with
    the keys that differ, kept as it is, and the run exits 1: a stale record skipped silently
    kept four DoRA traces named gc-on without checkpointing."""
    matrix = tmp_path / "m.yaml"
    base = f"model: {TINY / 'tiny-llava.yaml'}, seq_len: 48, trainable: [projector]"
    matrix.write_text(f"matrix: m\nbase: {{{base}}}\naxes: {{micro_batch: [1]}}\n")
    out = tmp_path / "out"
    assert run(["--matrix", str(matrix), "-o", str(out)]) == 0
    (path,) = out.glob("*.json")
    kept = path.read_bytes()
    capsys.readouterr()
    assert run(["--matrix", str(matrix), "-o", str(out)]) == 0
    assert "m_b1: present, skipped" in capsys.readouterr().err
    matrix.write_text(f"matrix: m\nbase: {{{base}, gradient_checkpointing: [language]}}\naxes: {{micro_batch: [1]}}\n")
    assert run(["--matrix", str(matrix), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert (
        f'm_b1: present, but not this entry\'s experiment (gradient_checkpointing [] in the record, ["language"] in the matrix); remove {path} to measure it again'
        in err
    )
    assert "0 measured, 0 already present, 1 in the matrix; 1 present of another experiment: m_b1" in err
    assert path.read_bytes() == kept


def test_sharded_experiments_are_refused_with_a_reason(tmp_path, capsys):
    experiment = tmp_path / "sharded.yaml"
    experiment.write_text(
        (TINY / "tiny-pretrain.yaml").read_text().replace("model: tiny-llava.yaml", f"model: {TINY / 'tiny-llava.yaml'}") + "parallel: {dp: 8, zero: 2}\n"
    )
    assert run([str(experiment)]) == 1
    assert "only dp 1, zero 0" in capsys.readouterr().err


def test_usage_errors():
    assert run([]) == 2
    assert run([str(TINY / "tiny-pretrain.yaml"), "--steps", "1"]) == 2


def test_a_sequence_shorter_than_the_image_tokens_is_refused(capsys):
    assert run([str(TINY / "tiny-pretrain.yaml"), "--seq-len", "8"]) == 1
    assert "shorter than the 16 image tokens" in capsys.readouterr().err


def test_an_attention_kernel_transformers_refuses_is_an_input_error(tmp_path, capsys):
    # Gemma 2 takes no sdpa in transformers (Gemma2ForCausalLM._sdpa_can_dispatch raises): an
    # input error naming the kernel, not a traceback (exit 3)
    root = Path(__file__).resolve().parent.parent
    experiment = tmp_path / "gemma2-sdpa.yaml"
    experiment.write_text(
        f"experiment: gemma2-sdpa\nmodel: {root / 'specs/gemma2/gemma-2-2b.yaml'}\nmicro_batch: 1\nseq_len: 64\n"
        "images_per_sample: 0\nattention: sdpa\nprecision: bf16\n"
    )
    assert run([str(experiment), "-o", str(tmp_path / "out.json")]) == 1
    assert "transformers does not build Gemma2ForCausalLM with attention 'sdpa'" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_format_text_prints_the_summary_instead_of_the_record(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert run([str(TINY / "tiny-pretrain.yaml"), "--steps", "2", "--format", "text", "-o", str(out)]) == 0
    measured = record.read_record(out)
    line = capsys.readouterr().out.strip()
    gib = 2**30
    assert line.startswith(f"{measured['name']}: {measured['allocated'] / gib:8.2f} GiB steady") and "\n" not in line
