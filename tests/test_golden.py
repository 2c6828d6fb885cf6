"""Golden cases: the layer table and the estimate text, exactly as a user sees them.

Each `tests/cases/<case>/case.yaml` names a spec or experiment and overrides; its
`expected/layers.tsv` and `expected/summary.txt` are compared byte for byte, and
`tests/golden/SUMMARY.tsv` rolls every case into one line so that a formula change shows its
effect on every model in one diff. Regenerate with `pytest --regen-golden` and review the diff.
"""

import functools
from pathlib import Path

import pytest

from compiler.api import estimate
from compiler.pipeline.load import load_yaml
from compiler.pipeline.render import table_tsv, text

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted(p.parent for p in (ROOT / "tests" / "cases").glob("*/case.yaml"))
SUMMARY = ROOT / "tests" / "golden" / "SUMMARY.tsv"
SUMMARY_COLUMNS = ("case", "allocated", "reserved", "device", "first_step", "seed_sum", "phase", "layer")


@functools.cache
def _report(case: Path):
    """A case's estimate, made once per test process: test_case and test_summary read the same
    one (an estimate is a pure function of the case's files, which a test run does not change;
    pytest-xdist's --dist loadfile runs the whole file in one worker)."""
    data = load_yaml(str(case / "case.yaml")).data
    return estimate(data["file"], **(data.get("overrides") or {}))


def _outputs(case: Path) -> dict[str, str]:
    r = _report(case)
    return {"layers.tsv": table_tsv(r.rows), "summary.txt": text(r)}


def _summary_line(case: Path) -> str:
    r = _report(case)
    e = r.estimate
    values = (case.name, r.allocated, r.reserved, r.device, e.allocated_first_step, e.seed_sum, e.peak.phase, e.peak.path)
    return "\t".join(map(str, values))


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case, request):
    for name, actual in _outputs(case).items():
        path = case / "expected" / name
        if request.config.getoption("--regen-golden"):
            path.parent.mkdir(exist_ok=True)
            path.write_text(actual)
            continue
        assert path.exists(), f"missing {path}; run pytest --regen-golden"
        assert actual == path.read_text(), f"{path} is stale; run pytest --regen-golden and review the diff"


def test_summary(request):
    actual = "\t".join(SUMMARY_COLUMNS) + "\n" + "".join(_summary_line(c) + "\n" for c in CASES)
    if request.config.getoption("--regen-golden"):
        SUMMARY.write_text(actual)
        return
    assert actual == SUMMARY.read_text(), "tests/golden/SUMMARY.tsv is stale; run pytest --regen-golden and review the diff"
