"""Shared pytest options and fixtures."""


def pytest_addoption(parser):
    parser.addoption(
        "--regen-golden",
        action="store_true",
        help="rewrite tests/cases/*/expected/ and tests/golden/SUMMARY.tsv from the current formulas instead of comparing",
    )
    parser.addoption(
        "--regen-invalid",
        action="store_true",
        help="rewrite tests/invalid/*/expected.txt from the current error output instead of comparing",
    )


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """memspec's user cache (hub headers, diff evaluations) in a folder of the test run, never the home one."""
    monkeypatch.setenv("MEMSPEC_CACHE", str(tmp_path_factory.getbasetemp() / "memspec-cache"))
