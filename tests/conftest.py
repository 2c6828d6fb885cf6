"""Shared pytest options."""


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
