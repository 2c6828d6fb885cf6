"""The verdict of measured memory on every formula: `memspec validate` over tests/measured/.

The thresholds live in tests/measured/thresholds.yaml and only ever tighten.
"""

from pathlib import Path

import pytest
import yaml

from compiler.validation import gate, render, validate_records

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "tests" / "measured"


@pytest.fixture(scope="module")
def comparisons():
    return validate_records([MEASURED])


def test_records_exist_and_are_estimated(comparisons):
    assert len(comparisons) >= 1
    assert any(c.estimated is not None for c in comparisons)


def test_gate(comparisons):
    limits = yaml.safe_load((MEASURED / "thresholds.yaml").read_text())["allocated"]
    failures = gate(comparisons, limits["max_mape_pct"], limits["max_worst_pct"], limits["max_under_estimates"])
    assert failures == [], render(comparisons)
