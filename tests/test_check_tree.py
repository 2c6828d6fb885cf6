"""`memspec check` over everything checked in, as README and the pre-commit hook run it."""

from pathlib import Path

import pytest

from compiler.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_every_spec_experiment_and_formula_checks(capsys):
    # a bare spec is estimated at micro-batch 1 and the shortest sequence that holds its images
    # at its default image size: LLaVA-NeXT's 672 x 672 default needs 2928 positions, not the
    # 576 of spec.image_tokens (the base image alone), which failed with E723
    assert main(["check", "specs/", "formulas/"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("ok: ")


def test_a_check_compiles_without_replaying_the_allocator(monkeypatch, capsys):
    """`check` needs no figure: an experiment's step is walked (its expansion, formulas and
    parameter count checked) and the caching allocator's replay, most of an estimate's time,
    is left out; an estimate still replays."""
    from compiler import api
    from compiler.pipeline import simulate

    replays = []
    real = simulate.replay
    monkeypatch.setattr(simulate, "replay", lambda *a, **k: replays.append(1) or real(*a, **k))
    assert main(["check", "specs/experiments/llava-1.5-7b-finetune.yaml"]) == 0, capsys.readouterr().err
    assert replays == []
    api.estimate("specs/experiments/llava-1.5-7b-finetune.yaml")
    assert replays == [1]


def test_the_libraries_examples_run_once_per_formulas_and_code(monkeypatch, tmp_path, capsys):
    """The built-in library's worked examples pass once and are kept: a second check of a spec
    runs none of them; a check with the cache off runs them all again."""
    from compiler.library import examples

    monkeypatch.setenv("MEMSPEC_CACHE", str(tmp_path))
    ran = []
    real = examples.run_examples
    monkeypatch.setattr(examples, "run_examples", lambda library: ran.append(len(library.formulas)) or real(library))
    for _ in range(2):
        assert main(["check", "specs/qwen2/qwen2.5-0.5b.yaml"]) == 0, capsys.readouterr().err
    assert len(ran) == 1 and ran[0] > 100
    monkeypatch.setenv("MEMSPEC_NO_CACHE", "1")
    assert main(["check", "specs/qwen2/qwen2.5-0.5b.yaml"]) == 0
    assert len(ran) == 2
