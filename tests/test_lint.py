"""The code passes the linter configured in pyproject.toml ([tool.ruff])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_is_clean():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "compiler", "tests", "benchmarks"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
