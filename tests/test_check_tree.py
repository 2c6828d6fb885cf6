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
