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


@pytest.fixture(scope="session", autouse=True)
def _own_cache(tmp_path_factory):
    """memspec's user cache (hub headers, checked inputs, validate's comparisons) in a folder of
    the test run, never the home one: one folder for every pytest-xdist worker of the run (the
    workers' temporary folders share a parent), as one user's runs share theirs, so that what one
    worker estimated another reads back. Its writes are atomic (compiler/checked.py).
    NB: session-scoped, so set before any module's fixtures (the measured gate's estimates),
    which a function-scoped fixture is not."""
    import os

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEMSPEC_CACHE", str(base / "memspec-cache"))
        yield
