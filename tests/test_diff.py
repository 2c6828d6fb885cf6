"""`memspec diff`: a deliberate formula change in a copy of the repository shows on every case it
affects, by exactly the bytes it adds, and on nothing else.

The copy is a fresh git repository holding the compiler, formulas, schemas, four model specs,
two experiments and five golden cases (LLaVA, whose projector is an `mlp_projector`, and
Qwen2.5 / Mistral, which have none). The change gives `mlp_projector` a resident buffer of
1 MiB = 1_048_576 B: one projector per LLaVA model, 512-aligned so the allocator adds nothing,
alive for the whole step, so every LLaVA peak (allocated, first step) rises by exactly
1_048_576 B and no other case moves.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from compiler.cli import main
from compiler.commands.diff import diff, render_json, render_markdown, render_text

ROOT = Path(__file__).resolve().parent.parent
FILES = [
    "specs/gpus.yaml",
    "specs/llava/llava-1.5-7b.yaml",
    "specs/qwen2/qwen2.5-0.5b.yaml",
    "specs/mistral/mistral-7b-v0.1.yaml",
    "specs/experiments/llava-1.5-7b-finetune.yaml",
    "specs/experiments/llava-1.5-7b-lora.yaml",
]
GOLDEN = [
    "llava-1.5-7b-finetune-eager-b1",
    "llava-1.5-7b-lora-r16",
    "llava-1.5-7b-full-fp32-sgd",
    "qwen2.5-0.5b-full-b4-s4096-sdpa-gc",
    "mistral-7b-v0.1-full-b4-s4096-sdpa",
]
AFFECTED = {
    "specs/experiments/llava-1.5-7b-finetune.yaml",
    "specs/experiments/llava-1.5-7b-lora.yaml",
    "specs/llava/llava-1.5-7b.yaml",
    "tests/cases/llava-1.5-7b-finetune-eager-b1",
    "tests/cases/llava-1.5-7b-lora-r16",
    "tests/cases/llava-1.5-7b-full-fp32-sgd",
}
UNAFFECTED = {
    "specs/qwen2/qwen2.5-0.5b.yaml",
    "specs/mistral/mistral-7b-v0.1.yaml",
    "tests/cases/qwen2.5-0.5b-full-b4-s4096-sdpa-gc",
    "tests/cases/mistral-7b-v0.1-full-b4-s4096-sdpa",
}
BUFFER = 1_048_576


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=memspec", "-c", "user.email=memspec@example.org", *argv], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def _change_formula(repo: Path) -> None:
    path = repo / "formulas" / "mlp_projector.yaml"
    text = path.read_text()
    assert "\nfactors:" not in text and "\ntransient:\n" in text
    path.write_text(text.replace("\ntransient:\n", f'\nfactors:\n  buffers: "{BUFFER}"\ntransient:\n'))


@pytest.fixture
def repo(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("compiler", "formulas", "schemas"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=ignore)
    for name in FILES:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)
    for case in GOLDEN:
        shutil.copytree(ROOT / "tests" / "cases" / case, repo / "tests" / "cases" / case)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    monkeypatch.chdir(repo)
    return repo


def _diff(capsys, *argv: str) -> dict:
    assert main(["diff", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cases_are_what_the_checkout_holds(repo, capsys):
    data = _diff(capsys)
    assert {c["case"] for c in data["cases"]} == AFFECTED | UNAFFECTED
    assert {c["case"]: c["kind"] for c in data["cases"]}["specs/llava/llava-1.5-7b.yaml"] == "spec"
    assert all(c["status"] == "unchanged" and c["before"] == c["after"] for c in data["cases"])
    assert data["base"]["commit"] == _git(repo, "rev-parse", "HEAD").strip()


def test_an_uncommitted_formula_change_moves_every_affected_case_and_nothing_else(repo, capsys):
    for name in FILES[1:4]:  # the premise: only the LLaVA spec has a projector
        assert ("mlp_projector" in (repo / name).read_text()) == ("llava" in name)
    _change_formula(repo)
    report = diff()  # NB: one evaluation of both trees, rendered three ways
    data = json.loads(render_json(report))
    moved = {c["case"]: c for c in data["cases"] if c["status"] != "unchanged"}
    assert set(moved) == AFFECTED
    for c in moved.values():
        assert c["status"] == "moved"
        assert c["delta"]["allocated"] == BUFFER, c["case"]
        assert c["delta"]["first_step"] == BUFFER, c["case"]
        assert c["delta_percent"] == pytest.approx(100 * BUFFER / c["before"]["allocated"])
    # largest change first; all equal here, so the rows that moved come before the rest
    assert [c["status"] for c in data["cases"]] == ["moved"] * len(AFFECTED) + ["unchanged"] * len(UNAFFECTED)

    md = render_markdown(report)
    assert "| case | allocated before | after | Δ bytes | Δ % | note |" in md
    for name in AFFECTED:
        assert f"| `{name}` |" in md and f"+{BUFFER:,}" in md
    assert not any(name in md for name in UNAFFECTED)
    assert "6 of 10 cases moved; 4 unchanged" in md

    text = render_text(report)
    assert text.splitlines()[0].startswith("memspec diff: base ") and "(merge-base of HEAD and main)" in text
    assert sum(f"+{BUFFER:,}" in line for line in text.splitlines()) == len(AFFECTED)


def test_a_committed_change_on_a_branch_against_the_merge_base(repo, capsys):
    _git(repo, "checkout", "-q", "-b", "feature")
    _change_formula(repo)
    _git(repo, "commit", "-q", "-am", "projector buffer")
    moved = {c["case"] for c in _diff(capsys)["cases"] if c["status"] != "unchanged"}
    assert moved == AFFECTED  # default base: the merge-base with main
    assert all(c["status"] == "unchanged" for c in _diff(capsys, "--base", "HEAD")["cases"])


def test_a_broken_formula_is_an_error_on_its_cases_not_a_crash(repo, capsys):
    path = repo / "formulas" / "mlp_projector.yaml"
    path.write_text(path.read_text().replace("inputs:\n", "inputz:\n", 1))
    data = _diff(capsys)
    # an estimate loads the formulas its spec reaches: the LLaVA cases (mlp_projector) fail,
    # the text-only ones do not move
    broken = [c for c in data["cases"] if c["status"] == "error"]
    assert broken and all("llava" in c["case"] for c in broken)
    assert all("formulas/mlp_projector.yaml" in c["after"]["error"] for c in broken)
    assert all(c["status"] != "error" for c in data["cases"] if "llava" not in c["case"])


def test_bad_base_and_no_repository(repo, capsys, tmp_path, monkeypatch):
    assert main(["diff", "--base", "no-such-branch"]) == 2  # the command line is wrong
    err = capsys.readouterr().err
    assert "E917 --base: 'no-such-branch' is not a revision of this repository" in err and "Traceback" not in err
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.chdir(outside)
    assert main(["diff"]) == 1
    assert "E916" in capsys.readouterr().err


def test_a_revision_is_evaluated_once_and_a_clean_tree_serves_both_sides(repo, capsys, monkeypatch, tmp_path):
    from compiler.commands import diff as diffmod

    monkeypatch.setenv("MEMSPEC_CACHE", str(tmp_path / "cache"))
    started = []
    real = diffmod._start
    monkeypatch.setattr(diffmod, "_start", lambda tree, *more: started.append(tree) or real(tree, *more))
    clean = _diff(capsys)
    assert started == [repo]  # the working tree is the base's content: one evaluation for both sides
    assert _diff(capsys) == clean and started == [repo]  # again: the base's cases come from the cache
    _change_formula(repo)
    moved = {c["case"] for c in _diff(capsys)["cases"] if c["status"] != "unchanged"}
    assert moved == AFFECTED and started == [repo, repo]  # only the edited working tree is evaluated
    (tmp_path / "cache" / "diff" / f"{diffmod._content_key(repo, _git(repo, 'rev-parse', 'HEAD').strip())}.json").write_text("{torn")
    assert {c["case"] for c in _diff(capsys)["cases"] if c["status"] != "unchanged"} == AFFECTED  # a torn entry: evaluated again
    assert len(started) == 4


def test_a_tree_evaluates_the_same_in_processes(tmp_path, monkeypatch):
    """The evaluator spreads a tree's cases over forked processes (one per CPU; two trees at
    once share them): the same rows in the same order as one process makes. The tree has no
    compiler of its own, so the installed one evaluates it, as for a repository of one's own
    specs; one of its cases is an error, which comes back on its row either way."""
    from compiler.commands import diff as diffmod

    tree = tmp_path / "tree"
    names = ("specs/gpus.yaml", "specs/qwen2/qwen2.5-0.5b.yaml", "specs/bloom/bloom-560m.yaml", "specs/experiments/qwen2.5-0.5b-full-h200.yaml")
    for name in names:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tree / name)
    (tree / "specs" / "broken.yaml").write_text("model: {name: broken}\n")
    monkeypatch.setenv("MEMSPEC_CACHE", str(tmp_path / "cache"))
    rows = [diffmod._finish(diffmod._start(tree, n), "the tree") for n in (1, 2)]
    assert rows[0] == rows[1]
    # four cases: two processes take the three after the first
    assert [r["case"] for r in rows[0]] == [
        "specs/bloom/bloom-560m.yaml",
        "specs/broken.yaml",
        "specs/experiments/qwen2.5-0.5b-full-h200.yaml",
        "specs/qwen2/qwen2.5-0.5b.yaml",
    ]
    assert "error" in rows[0][1] and all("allocated" in r for r in rows[0][::2] + rows[0][3:])
