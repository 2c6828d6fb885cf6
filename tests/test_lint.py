"""The code passes the linter configured in pyproject.toml ([tool.ruff]) and is formatted as
`ruff format` writes it (the line length of [tool.ruff])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "compiler", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_is_clean():
    # NB: the house limits (tests/test_architecture.py: modules <= 800 lines, functions <= 80)
    # are counted on the formatted code; `ruff format compiler tests benchmarks` fixes a failure
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "compiler", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
