"""`memspec list` and short names: the bundled specs and experiments, named from any directory."""

import json

import pytest

from compiler import api
from compiler.cli import main
from compiler.commands import catalog
from compiler.errors import MemspecError


def test_every_bundled_spec_and_experiment_is_listed(capsys):
    assert main(["list", "--format", "json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    # LLaVA-1.5-7B: CLIP ViT-L/14-336 303,507,456 + projector 20,979,712 + Vicuna 6,738,939,904
    assert listed["llava-1.5-7b"]["parameters"] == 303_507_456 + 20_979_712 + 6_738_939_904 == 7_063_427_072
    assert listed["llava-1.5-7b"]["modules"] == ["vision", "projector", "language"]
    assert listed["llava-1.5-7b-finetune"]["kind"] == "experiment" and listed["llava-1.5-7b-finetune"]["model"] == "llava-1.5-7b"
    assert not any(n.startswith(("llava-1.5_", "gpu-")) for n in listed)  # matrices are not bundled inputs


def test_a_filter_narrows_the_list(capsys):
    assert main(["list", "Qwen2.5-VL"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert rows == ["qwen2.5-vl-7b-instruct"]


def test_a_short_name_works_from_any_directory(tmp_path, monkeypatch, capsys):
    by_path = api.estimate(str(catalog.find("llava-1.5-7b")), micro_batch=4, seq_len=2048)
    monkeypatch.chdir(tmp_path)
    assert main(["estimate", "llava-1.5-7b", "--micro-batch", "4", "--seq-len", "2048", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak"]["allocated"] == by_path.allocated
    # a spec's model: name works too (Meta-Llama-3-8B is specs/llama/llama-3-8b.yaml)
    assert catalog.find("Meta-Llama-3-8B") == catalog.find("llama-3-8b")


def test_a_path_that_exists_is_never_a_short_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llava-1.5-7b").write_text("not: a spec\n")
    assert main(["estimate", "llava-1.5-7b", "--micro-batch", "1", "--seq-len", "2048"]) == 1  # the local file, refused


def test_an_ambiguous_short_name_is_refused(monkeypatch):
    twice = catalog.entries() + tuple(
        e.__class__(e.name, e.kind, e.path.with_name("copy.yaml"), e.model, e.parameters, e.modules, e.summary)
        for e in catalog.entries()
        if e.name == "llava-1.5-7b"
    )
    monkeypatch.setattr(catalog, "entries", lambda: twice)
    with pytest.raises(MemspecError, match="E111|names 2 bundled files"):
        catalog.find("llava-1.5-7b")


def test_a_short_name_in_any_case_or_without_its_suffix():
    assert catalog.find("LLaVA-1.5-7B") == catalog.find("llava-1.5-7b")
    # the one spec continuing the name at a dash: the -instruct checkpoint
    assert catalog.find("qwen2-vl-7b").name == "qwen2-vl-7b-instruct.yaml"
    # a name that two specs continue is refused, naming both
    with pytest.raises(MemspecError) as err:
        catalog.find("mixtral-8x7b")
    assert "mixtral-8x7b-v0.1.yaml" in err.value.render() and "mixtral-8x7b-v0.1-router-aux.yaml" in err.value.render()
    assert catalog.find("qwen2-v") is None  # a name continues at a dash only


def test_a_bare_spec_takes_the_trainers_defaults_and_says_so(capsys):
    # neither --micro-batch nor --seq-len: TrainingArguments' per_device_train_batch_size 8,
    # TRL SFTConfig's max_length 1024 (LLaVA-1.5: 576 image tokens + 448 text)
    assert main(["estimate", "llava-1.5-7b", "--format", "json"]) == 0
    captured = capsys.readouterr()
    by_flags = api.estimate(str(catalog.find("llava-1.5-7b")), micro_batch=8, seq_len=1024)
    assert json.loads(captured.out)["peak"]["allocated"] == by_flags.allocated
    assert captured.err.splitlines() == [
        "note: no --micro-batch: 8, transformers' TrainingArguments default per_device_train_batch_size",
        "note: no --seq-len: 1024, TRL's SFTConfig default max_length, image tokens included",
    ]
    # a flag given takes no default and no note; an experiment states both
    assert main(["estimate", "llava-1.5-7b", "--micro-batch", "2", "--format", "json"]) == 0
    assert capsys.readouterr().err.splitlines() == ["note: no --seq-len: 1024, TRL's SFTConfig default max_length, image tokens included"]
    assert main(["estimate", "llava-1.5-7b-finetune", "--format", "json"]) == 0
    assert capsys.readouterr().err == ""


def test_fit_searches_the_micro_batch_without_one_given(capsys):
    assert main(["fit", "qwen2.5-0.5b", "--seq-len", "2048", "--gpu", "24GiB", "--format", "json"]) == 0
    answered = json.loads(capsys.readouterr().out)
    assert main(["fit", "qwen2.5-0.5b", "--seq-len", "2048", "--micro-batch", "1", "--gpu", "24GiB", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["micro_batch"] == answered["micro_batch"]
    assert answered["micro_batch"]["value"] >= 1
