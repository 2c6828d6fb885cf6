"""Diagnostics render exactly as the user reads them; errors sort and count them."""

import pytest

from compiler.errors import Diagnostic, MemspecError, UsageError, did_you_mean


def test_render_with_path_and_help():
    d = Diagnostic("E203", "specs/x.yaml", 14, 9, "$.modules.language.layers", "unknown key 'hiden'", "did you mean 'hidden'?")
    assert d.render() == ("specs/x.yaml:14:9: E203 $.modules.language.layers: unknown key 'hiden'\nhelp: did you mean 'hidden'?")


def test_render_without_help_or_path():
    d = Diagnostic("E107", "x.yaml", 3, 1, "", "more than one YAML document in the file")
    assert d.render() == "x.yaml:3:1: E107 more than one YAML document in the file"


def test_render_leaves_out_unknown_location_parts():
    assert Diagnostic("E101", "x.yaml", 0, 0, "", "file not found").render() == "x.yaml: E101 file not found"
    assert Diagnostic("E102", "x.yaml", 4, 0, "", "bad").render() == "x.yaml:4: E102 bad"
    assert Diagnostic("E001", "", 0, 0, "", "unknown flag --x").render() == "E001 unknown flag --x"


def test_root_path_is_shown():
    d = Diagnostic("E202", "x.yaml", 1, 1, "$", "expected mapping, got a list")
    assert d.render() == "x.yaml:1:1: E202 $: expected mapping, got a list"


def test_error_sorts_by_file_line_col_and_counts():
    late = Diagnostic("E203", "b.yaml", 2, 1, "$.z", "unknown key 'z'")
    middle = Diagnostic("E201", "a.yaml", 9, 3, "$.m", "missing required key 'k'")
    early = Diagnostic("E103", "a.yaml", 9, 1, "$.a", "duplicate key 'a'", "first defined at line 1")
    error = MemspecError([late, middle, early])
    assert error.diagnostics == (early, middle, late)
    assert error.render() == (
        "a.yaml:9:1: E103 $.a: duplicate key 'a'\n"
        "help: first defined at line 1\n"
        "\n"
        "a.yaml:9:3: E201 $.m: missing required key 'k'\n"
        "\n"
        "b.yaml:2:1: E203 $.z: unknown key 'z'\n"
        "\n"
        "3 errors"
    )
    assert str(error) == error.render()


def test_single_diagnostic_has_no_count():
    d = Diagnostic("E106", "x.yaml", 1, 1, "", "empty document")
    error = MemspecError(d)
    assert error.diagnostics == (d,)
    assert error.render() == "x.yaml:1:1: E106 empty document"


def test_exit_codes():
    d = Diagnostic("E001", "", 0, 0, "", "unknown flag --x")
    assert MemspecError(d).exit_code == 1
    assert UsageError(d).exit_code == 2
    assert isinstance(UsageError(d), MemspecError)


def test_an_error_without_diagnostics_is_a_bug():
    with pytest.raises(ValueError):
        MemspecError([])


def test_diagnostic_is_frozen_and_hashable():
    d = Diagnostic("E203", "x.yaml", 1, 1, "$.a", "unknown key 'a'")
    with pytest.raises(AttributeError):
        d.line = 2  # type: ignore[misc]
    assert len({d, Diagnostic("E203", "x.yaml", 1, 1, "$.a", "unknown key 'a'")}) == 1


def test_did_you_mean():
    assert did_you_mean("hiden", ["hidden", "heads", "vocab"]) == "did you mean 'hidden'?"
    assert did_you_mean("zzz", ["hidden", "heads"]) is None
    assert did_you_mean("x", []) is None
    assert did_you_mean("lr", iter(["lr_scheduler", "lrs"])) == "did you mean 'lrs'?"


def test_every_code_the_compiler_raises_is_listed_in_the_table_and_the_docs():
    """A code added without a line in compiler/errors.py's table and docs/errors.md fails
    here; a listed code nothing raises any more is a retired one left in the table."""
    import re
    from pathlib import Path

    import compiler.errors

    root = Path(__file__).resolve().parent.parent
    raised = set()
    for path in (root / "compiler").rglob("*.py"):
        raised |= set(re.findall(r'"(E\d{3})"', path.read_text()))
    table = set(re.findall(r"\b(E\d{3})\b", compiler.errors.__doc__))
    documented = set(re.findall(r"\b(E\d{3})\b", (root / "docs" / "errors.md").read_text()))
    assert raised - table == set(), "raised but not in compiler/errors.py's table"
    assert table - raised - {"E001"} == set(), "in the table but raised nowhere"
    assert table - documented == set(), "in the table but not in docs/errors.md"
