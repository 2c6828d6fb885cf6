"""The commands in the guides and the README parse: every `memspec` line of a shell block in
docs/*.md and README.md is read by the real argument parser (a renamed flag or verb fails
here), and every checked-in file such a line names exists. The CI example and the pre-commit
hooks name real commands too."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from compiler.cli import parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
OUTPUT_FLAGS = {"-o", "--output", "--svg", "--timeline", "--inventory"}
CHECKED_IN = ("specs/", "formulas/", "tests/", "docs/")


def _commands(page: Path) -> list[str]:
    """`memspec ...` lines of the page's shell blocks (fences with no language, sh or bash),
    continuation lines joined; lines like `memspec diff: base ...` are printed output."""
    out, block, fence = [], None, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            if block is None:
                block, fence = [], line[3:].strip()
            else:
                if fence in ("", "sh", "bash"):
                    for cmd in "\n".join(block).replace("\\\n", " ").splitlines():
                        cmd = cmd.strip()
                        if cmd.startswith("memspec ") and not re.match(r"memspec \w+:", cmd):
                            out.append(cmd)
                block = None
        elif block is not None:
            block.append(line)
    return out


def _created(page: Path) -> set[str]:
    """Files a page makes before using them: `-o FILE` of its commands, `# path` headers of its blocks."""
    text = page.read_text()
    return set(re.findall(r"(?:-o|--output) (\S+)", text)) | set(re.findall(r"^# (\S+\.ya?ml)$", text, re.M))


COMMANDS = [(p.relative_to(ROOT).as_posix(), c) for p in PAGES for c in _commands(p)]


def test_the_guides_have_commands():
    pages = {p for p, _ in COMMANDS}
    for name in (
        "docs/estimate-from-a-hub-id.md",
        "docs/check-in-a-spec.md",
        "docs/write-a-formula.md",
        "docs/review-a-formula-change.md",
        "docs/validate-against-your-measurements.md",
        "README.md",
    ):
        assert name in pages, name


@pytest.mark.parametrize("page, command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_command_parses(page, command):
    words = shlex.split(command, comments=True)
    for cut in ("|", ">", "&&"):
        if cut in words:
            words = words[: words.index(cut)]
    try:
        parser().parse_args(words[1:])
    except SystemExit as exc:
        pytest.fail(f"{page}: '{command}' does not parse (exit {exc.code})")
    for before, word in zip(["memspec", *words], words):
        if word.startswith(CHECKED_IN) and before not in OUTPUT_FLAGS and word not in _created(ROOT / page):
            assert (ROOT / word).exists(), f"{page}: '{command}' names {word}, which does not exist"


def test_ci_example_runs_memspec_diff_on_pull_requests():
    workflow = yaml.safe_load((ROOT / "docs" / "ci" / "memspec-diff.yml").read_text())
    assert "pull_request" in workflow[True]  # PyYAML reads the key `on` as True
    steps = workflow["jobs"]["memspec-diff"]["steps"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert 'memspec diff --base "origin/${{ github.base_ref }}" --format markdown' in runs
    assert any(s.get("with", {}).get("fetch-depth") == 0 for s in steps)  # the base branch's history
    assert not (ROOT / ".github" / "workflows" / "memspec-diff.yml").exists()  # an example, not this repository's CI


def test_pre_commit_hooks():
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"memspec-check", "memspec-diff"}
    verbs = set(next(a for a in parser()._actions if hasattr(a, "choices") and a.choices and "estimate" in a.choices).choices)
    for hook in hooks.values():
        assert hook["entry"].split()[0] == "memspec" and hook["entry"].split()[1] in verbs
        assert hook["language"] == "python"
    files = re.compile(hooks["memspec-check"]["files"])
    assert files.search("specs/llava/llava-1.5-7b.yaml") and files.search("formulas/linear.yaml")
    assert not files.search(".github/workflows/ci.yml") and not files.search("docs/ci/memspec-diff.yml")
    assert hooks["memspec-diff"]["pass_filenames"] is False
