"""Bad inputs and the exact error text a user sees for each.

Each folder under tests/invalid/ is one case: the bad input file(s), `args` (one line, the
command-line arguments, paths relative to the folder), `expected.txt` (the exact stderr) and
`exit_code`. The command runs in-process with the folder as the working directory.

NB: an absolute path in a message (a "looked for ..." help, a bundled formula file) depends on
where the checkout lives, so the case folder's absolute path is written `<case>` in
`expected.txt`, and the folder the bundled formulas are read from (the checkout, or the
installed package's data) `<bundled>`.

`pytest --regen-invalid` rewrites every `expected.txt` from the current output (the exit code
is still asserted); read the diff as a user would before committing it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from compiler.cli import main
from compiler.paths import formulas_dir

INVALID = Path(__file__).parent / "invalid"
CASES = sorted(p for p in INVALID.iterdir() if (p / "args").is_file())


def _normalized(text: str, case: Path) -> str:
    return text.replace(str(case.resolve()), "<case>").replace(str(formulas_dir().parent), "<bundled>")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_invalid_input(case: Path, monkeypatch, capsys, request):
    args = shlex.split((case / "args").read_text(encoding="utf-8").strip())
    monkeypatch.chdir(case)
    code = main(args)
    captured = capsys.readouterr()
    stderr = _normalized(captured.err, case)
    if request.config.getoption("--regen-invalid"):
        (case / "expected.txt").write_text(stderr, encoding="utf-8")
    assert captured.out == ""
    assert stderr == (case / "expected.txt").read_text(encoding="utf-8")
    assert code == int((case / "exit_code").read_text(encoding="utf-8"))
    assert code in (1, 2)  # an input or usage error, never a bug (3) or success


def test_enough_cases():
    assert len(CASES) >= 18
