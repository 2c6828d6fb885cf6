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
