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
    twice = catalog.entries() + tuple(e.__class__(e.name, e.kind, e.path.with_name("copy.yaml"), e.model, e.parameters, e.modules, e.summary)
                                      for e in catalog.entries() if e.name == "llava-1.5-7b")
    monkeypatch.setattr(catalog, "entries", lambda: twice)
    with pytest.raises(MemspecError, match="E111|names 2 bundled files"):
        catalog.find("llava-1.5-7b")
