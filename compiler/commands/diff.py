"""`memspec diff`: what a change does to the peak of every checked-in case.

Contract: `diff(base)` evaluates every case at a base revision and in the working tree and
returns a `DiffReport`; `render_text`, `render_markdown` and `render_json` print it, the
cases that moved first, largest |delta| first.

The cases are every file a reviewer can name:
- every experiment under `specs/` as written;
- every model spec under `specs/` (not `specs/families/`, `specs/matrices/` or the GPU
  catalog) at one reference setup: the spec's defaults (everything trainable, bf16-mixed
  AdamW), micro-batch 1, seq-len 2048 (or the spec's image tokens when more);
- every golden case `tests/cases/<name>/case.yaml` (a file and its overrides), which covers
  the variants no experiment file spells out (LoRA ranks, fp32 SGD, ZeRO-1 ...).

The base is `--base REV`, by default the merge-base of HEAD and `main` (else `origin/main`,
else HEAD): on a branch that is everything the branch changed, committed or not; on main, the
uncommitted edits. Each side is evaluated by its own compiler: the base revision is unpacked
with `git archive` into a temporary folder and its own `compiler` package, formulas and specs
estimate its cases in a subprocess, which spreads them over forked processes, one per CPU
this process may use (the two trees share them when both are evaluated); the working tree
(the files on disk, uncommitted and untracked ones included) does the same with its own. A
change to the Python compiler therefore shows as well as one to a formula or a spec: the diff is the effect of the change,
whatever it touched. Where a tree has no `compiler/` package (a repository of one's own specs
using an installed memspec), the installed one evaluates both sides, so only the data moves.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import Diagnostic, MemspecError, UsageError
from ..paths import user_cache
from .processes import cpus

FIGURES = ("allocated", "reserved", "device", "first_step")
REFERENCE_MICRO_BATCH = 1
REFERENCE_SEQ = 2048

# Runs inside each tree (cwd = its root) with only what every memspec since the public
# `compiler.api.estimate` has had; prints one JSON object per case.
EVALUATOR = r"""
import json, sys
from pathlib import Path
if Path("compiler/api.py").is_file():
    sys.path.insert(0, ".")
from compiler import api
from compiler.errors import MemspecError
load_yaml = api.load_yaml  # NB: compiler.api names it in every revision; the module moved

REF_B, REF_S, PROCESSES = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cases = []
for p in sorted(Path("specs").rglob("*.yaml")) if Path("specs").is_dir() else ():
    if len(p.parts) > 1 and p.parts[1] in ("families", "matrices"):
        continue
    try:
        kind = api.file_kind(load_yaml(str(p)))
    except MemspecError:
        kind = "spec"  # NB: an unreadable file is reported as a case with an error
    if kind == "experiment":
        cases.append(("experiment", p.as_posix(), p.as_posix(), None))
    elif kind == "spec":
        cases.append(("spec", p.as_posix(), p.as_posix(), "reference"))
for c in sorted(Path("tests/cases").glob("*/case.yaml")) if Path("tests/cases").is_dir() else ():
    cases.append(("golden", c.parent.as_posix(), None, c.as_posix()))

def evaluate(case):
    kind, name, file, extra = case
    row = {"case": name, "kind": kind}
    try:
        if kind == "golden":
            data = load_yaml(extra).data
            file, overrides = data["file"], dict(data.get("overrides") or {})
        elif kind == "spec":
            tokens = api.load_spec(file).image_tokens
            overrides = {"micro_batch": REF_B, "seq_len": max(REF_S, tokens)}
        else:
            overrides = {}
        r = api.estimate(file, **overrides)
        row.update(file=file, allocated=r.allocated, reserved=r.reserved, device=r.device,
                   first_step=getattr(r.estimate, "allocated_first_step", r.estimate.first_step.total), phase=r.estimate.peak.phase, layer=r.estimate.peak.path)
    except MemspecError as exc:
        row["error"] = exc.render().splitlines()[0]
    except Exception as exc:  # a bug in that tree's compiler: reported on its case, not fatal
        row["error"] = f"internal error: {type(exc).__name__}: {exc}"
    return row

# NB: the cases are independent: after the first (evaluated here, so that the processes start
# with what it loaded and checked), spread over PROCESSES forked processes, answers in order;
# with the standard library's pool, not commands.processes.ordered, which a base revision's
# compiler may not have
import multiprocessing
out = [evaluate(c) for c in cases[:1]]
if PROCESSES > 1 and len(cases) > 2 and "fork" in multiprocessing.get_all_start_methods():
    with multiprocessing.get_context("fork").Pool(min(PROCESSES, len(cases) - 1)) as pool:
        out += pool.map(evaluate, cases[1:], chunksize=1)
else:
    out += [evaluate(c) for c in cases[1:]]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Change:
    case: str
    kind: str  # experiment | spec | golden
    before: dict[str, Any] | None  # None: the case is new
    after: dict[str, Any] | None  # None: the case was removed

    def delta(self, figure: str = "allocated") -> int | None:
        if not self.before or not self.after or figure not in self.before or figure not in self.after:
            return None
        return self.after[figure] - self.before[figure]

    def percent(self, figure: str = "allocated") -> float | None:
        d = self.delta(figure)
        return None if d is None or not self.before[figure] else 100.0 * d / self.before[figure]

    @property
    def status(self) -> str:
        """added | removed | error | moved | unchanged"""
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        if "error" in self.before or "error" in self.after:
            return "unchanged" if self.before.get("error") == self.after.get("error") else "error"
        keys = (*FIGURES, "phase", "layer")
        return "moved" if any(self.before[k] != self.after[k] for k in keys) else "unchanged"


@dataclass(frozen=True)
class DiffReport:
    base: str  # what the user named (or the default's description)
    commit: str  # the base commit, 40 hex digits
    changes: tuple[Change, ...]  # moved / added / removed / error first (largest |delta| first), then unchanged

    @property
    def moved(self) -> list[Change]:
        return [c for c in self.changes if c.status != "unchanged"]


def _git(root: Path, *argv: str, binary: bool = False) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *argv], cwd=root, capture_output=True, text=not binary, check=False)
    except FileNotFoundError:
        raise MemspecError(Diagnostic("E916", "", 0, 0, "", "git is not installed", "memspec diff reads the base revision with git")) from None


def repo_root(cwd: Path | None = None) -> Path:
    cwd = cwd or Path.cwd()
    got = _git(cwd, "rev-parse", "--show-toplevel")
    if got.returncode != 0:
        raise MemspecError(
            Diagnostic("E916", "", 0, 0, "", f"{cwd} is not inside a git repository", "run memspec diff in the checkout whose specs and formulas changed")
        )
    return Path(got.stdout.strip())


def resolve_base(root: Path, base: str | None) -> tuple[str, str]:
    """(description, commit) of the base revision."""
    if base:
        got = _git(root, "rev-parse", "--verify", "--quiet", base + "^{commit}")
        if got.returncode != 0:
            raise UsageError(
                Diagnostic(
                    "E917",
                    "",
                    0,
                    0,
                    "--base",
                    f"'{base}' is not a revision of this repository",
                    "name a branch, tag or commit (git log --oneline); in CI fetch the base first: git fetch origin main",
                )
            )
        return base, got.stdout.strip()
    for candidate in ("main", "origin/main"):
        if _git(root, "rev-parse", "--verify", "--quiet", candidate + "^{commit}").returncode == 0:
            got = _git(root, "merge-base", "HEAD", candidate)
            if got.returncode == 0:
                return f"merge-base of HEAD and {candidate}", got.stdout.strip()
    got = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if got.returncode != 0:
        raise MemspecError(Diagnostic("E917", "", 0, 0, "--base", "the repository has no commit to compare with", "commit once, or give --base REV"))
    return "HEAD", got.stdout.strip()


def _unpack(root: Path, commit: str, into: Path) -> None:
    got = _git(root, "archive", "--format=tar", commit, binary=True)
    if got.returncode != 0:
        raise MemspecError(Diagnostic("E917", "", 0, 0, "--base", f"git archive {commit[:12]} failed: {got.stderr.decode(errors='replace').strip()}"))
    with tarfile.open(fileobj=io.BytesIO(got.stdout)) as tar:
        tar.extractall(into, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(into)  # noqa: S202 (our own archive)


def _start(tree: Path, processes: int) -> subprocess.Popen:
    """The evaluation of `tree`'s cases in a fresh interpreter, spread over `processes`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # NB: each tree imports its own compiler
    return subprocess.Popen(
        [sys.executable, "-c", EVALUATOR, str(REFERENCE_MICRO_BATCH), str(REFERENCE_SEQ), str(processes)],
        cwd=tree,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(proc: subprocess.Popen, label: str) -> list[dict[str, Any]]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        tail = "; ".join(err.strip().splitlines()[-3:])
        raise MemspecError(
            Diagnostic(
                "E918",
                "",
                0,
                0,
                "",
                f"the cases of {label} could not be evaluated: {tail}",
                "a base older than compiler.api.estimate cannot be compared; pick a later --base",
            )
        )
    return json.loads(out)


def diff(base: str | None = None, cwd: Path | None = None) -> DiffReport:
    root = repo_root(cwd)
    label, commit = resolve_base(root, base)
    key = _content_key(root, commit)
    before = _cached(key)
    same = _same_as(root, commit)
    n = cpus()
    if before is None and same:
        before = _finish(_start(root, n), "the working tree")  # NB: one evaluation serves both sides
    if before is not None and same:
        after = before
    elif before is not None:
        after = _finish(_start(root, n), "the working tree")
    else:
        with tempfile.TemporaryDirectory(prefix="memspec-diff-") as tmp:
            _unpack(root, commit, Path(tmp))
            # NB: both trees at once, the CPUs shared; each is a fresh interpreter importing
            # its own compiler
            before_proc, after_proc = _start(Path(tmp), max(1, n // 2)), _start(root, max(1, n - n // 2))
            before = _finish(before_proc, f"the base {commit[:12]}")
            after = _finish(after_proc, "the working tree")
    _store(key, before)
    return DiffReport(label, commit, compare(before, after))


# What the evaluation of a tree reads: its compiler, its data, its golden cases.
EVALUATED = ("compiler", "specs", "formulas", "schemas", "tests/cases")


def _content_key(root: Path, commit: str) -> str | None:
    """The git object ids of what a revision's evaluation reads, hashed; None for a tree
    without its own compiler (the installed memspec, whatever its version, evaluates it)."""
    ids = [_git(root, "rev-parse", "--verify", "--quiet", f"{commit}:{p}").stdout.strip() for p in EVALUATED]
    if not ids[0]:
        return None
    return hashlib.sha256(" ".join(ids).encode()).hexdigest()


def _same_as(root: Path, commit: str) -> bool:
    """The working tree's evaluated files are the revision's: no change to a tracked file, no untracked one."""
    if _git(root, "diff", "--quiet", commit, "--", *EVALUATED).returncode != 0:
        return False
    return not _git(root, "ls-files", "--others", "--exclude-standard", "--", *EVALUATED).stdout.strip()


def _cache_file(key: str) -> Path:
    return user_cache() / "diff" / f"{key}.json"


def _cached(key: str | None) -> list[dict[str, Any]] | None:
    """A revision's cases evaluated before: its content decides them, so they are reused."""
    if key is None:
        return None
    try:
        cases = json.loads(_cache_file(key).read_text())
    except (OSError, ValueError):
        return None  # NB: absent, unreadable or torn: evaluate again
    return cases if isinstance(cases, list) else None


def _store(key: str | None, cases: list[dict[str, Any]]) -> None:
    if key is None:
        return
    path = _cache_file(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
            json.dump(cases, f)
        os.replace(f.name, path)
    except OSError:
        pass  # NB: a cache that cannot be written only costs the next diff its evaluation


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[Change, ...]:
    b = {r["case"]: r for r in before}
    a = {r["case"]: r for r in after}
    names = list(dict.fromkeys([*a, *b]))
    changes = [Change(n, (a.get(n) or b[n])["kind"], b.get(n), a.get(n)) for n in names]
    order = {"moved": 0, "error": 1, "added": 2, "removed": 3, "unchanged": 4}

    def key(c: Change):
        return (order[c.status] > 1, -abs(c.delta("allocated") or 0), -abs(c.delta("device") or 0), order[c.status], c.case)

    return tuple(sorted(changes, key=key))


# ----------------------------------------------------------------------------- rendering

GIB = 1 << 30


def _gib(c: dict[str, Any] | None, figure: str = "allocated") -> str:
    if c is None:
        return "-"
    if "error" in c:
        return "error"
    return f"{c[figure] / GIB:.2f} GiB"


def _delta(c: Change) -> tuple[str, str]:
    d, p = c.delta(), c.percent()
    if d is None:
        return c.status, ""
    return f"{d:+,}", f"{p:+.3f} %"


def _note(c: Change) -> str:
    """What else changed: the peak's place, the other figures, an error."""
    notes = []
    if c.status == "error":
        notes.append("; ".join(f"{side}: {r['error']}" for side, r in (("before", c.before), ("after", c.after)) if "error" in r))
    elif c.status == "moved":
        if (c.before["phase"], c.before["layer"]) != (c.after["phase"], c.after["layer"]):
            notes.append(f"peak {c.before['phase']} at {c.before['layer']} -> {c.after['phase']} at {c.after['layer']}")
        else:
            notes.append(f"peak {c.after['phase']} at {c.after['layer']}")
        for f in ("device", "first_step"):
            if c.delta(f) and c.delta(f) != c.delta():
                notes.append(f"{f.replace('_', ' ')} {c.delta(f):+,} B")
    elif c.status == "added" and "error" in c.after:
        notes.append(c.after["error"])
    return "; ".join(notes)


def _summary(r: DiffReport) -> str:
    counts = {k: sum(c.status == k for c in r.changes) for k in ("moved", "error", "added", "removed", "unchanged")}
    text = f"{counts['moved']} of {len(r.changes)} cases moved"
    for status, words in (("error", "fail on one side"), ("added", "new"), ("removed", "removed")):
        if counts[status]:
            text += f", {counts[status]} {words}"
    return text + f"; {counts['unchanged']} unchanged"


def render_text(r: DiffReport) -> str:
    head = ("case", "allocated before", "after", "delta B", "delta %", "")
    body = [(c.case, _gib(c.before), _gib(c.after), *_delta(c), _note(c)) for c in r.moved]
    lines = [f"memspec diff: base {r.commit[:12]} ({r.base}) -> working tree", ""]
    if body:
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(5)]
        for row in [head, *body]:
            cells = [row[0].ljust(widths[0]), *(x.rjust(w) for x, w in zip(row[1:5], widths[1:])), row[5]]
            lines.append("  ".join(cells).rstrip())
        lines.append("")
    lines.append(_summary(r) + " (allocated: torch.cuda.max_memory_allocated(); GiB = 2^30 B)")
    return "\n".join(lines) + "\n"


def render_markdown(r: DiffReport) -> str:
    lines = [f"### memspec diff: `{r.commit[:12]}` ({r.base}) → this change", ""]
    if r.moved:
        lines += ["| case | allocated before | after | Δ bytes | Δ % | note |", "|---|---:|---:|---:|---:|---|"]
        for c in r.moved:
            d, p = _delta(c)
            note = _note(c).replace("|", "\\|")
            lines.append(f"| `{c.case}` | {_gib(c.before)} | {_gib(c.after)} | {d} | {p} | {note} |")
        lines.append("")
    lines.append(_summary(r) + ". Peak per GPU of one training step, `torch.cuda.max_memory_allocated()`; GiB = 2^30 bytes.")
    return "\n".join(lines) + "\n"


def render_json(r: DiffReport) -> str:
    data = {
        "schema": "memspec/diff/v1",
        "base": {"name": r.base, "commit": r.commit},
        "reference_setup": {"micro_batch": REFERENCE_MICRO_BATCH, "seq_len": REFERENCE_SEQ},
        "cases": [
            {
                "case": c.case,
                "kind": c.kind,
                "status": c.status,
                "before": c.before,
                "after": c.after,
                "delta": {f: c.delta(f) for f in FIGURES},
                "delta_percent": c.percent(),
            }
            for c in r.changes
        ],
    }
    return json.dumps(data, indent=2) + "\n"
