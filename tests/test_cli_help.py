"""Every verb of `memspec` has --help with at least one example, and --format json where it
prints results; the example lines name the verb they belong to."""

import argparse
import re

import pytest

from compiler.cli import main, parser

VERBS = ("list", "estimate", "report", "table", "check", "import", "fit", "validate", "measure", "sweep", "diff")


def _verbs() -> list[str]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_the_verbs_are_the_documented_ones():
    assert sorted(_verbs()) == sorted(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_help_has_examples_and_json(verb, capsys):
    assert main([verb, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: memspec {verb}")
    assert "\nexamples:\n" in out
    examples = [line.strip() for line in out.split("\nexamples:\n", 1)[1].splitlines() if line.strip().startswith("memspec ")]
    assert examples and all(line.startswith(f"memspec {verb}") for line in examples), examples
    choices = re.search(r"--format \{([a-z,]+)\}", out)
    assert choices and "json" in choices.group(1).split(","), f"memspec {verb} has no --format json"


def test_top_level_help_points_to_the_verbs(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "\nexamples:\n" in out and "memspec COMMAND --help" in out
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s+\S", out, re.M), verb
