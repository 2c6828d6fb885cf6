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


# The longest files first, each on a worker of its own while the rest fill the other (the
# longest-processing-time-first rule): the measured gate's fixture (every record estimated,
# 491 to 514 s of a full `pytest -n 2` here), the docs pages run as written (the review page
# 117 to 126 s, README.md 84 to 89 s) and the check of every shipped file. pytest-xdist orders
# a `--dist loadfile` run's files by their number of tests, which put the gate's 16 tests
# after 92 % of the suite: its worker ran it for eight minutes after the other had little left.
LONGEST_FIRST = ("test_measured_gate.py", "test_docs_run.py", "test_check_tree.py")


def pytest_configure(config):
    # NB: the files in the order pytest_collection_modifyitems leaves them (pytest-xdist >= 3.8)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # NB: stable, the rest as collected
