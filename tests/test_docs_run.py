"""Every `memspec` command of README.md and docs/*.md runs as written, page by page in order.

Each page runs in its own folder laid out as a user's would be: a copy of `specs/` (pages
write into it), the checked-in `formulas/`, `schemas/`, `tests/` and `docs/` beside it, the
YAML files a page shows under a `# path` header written where it says, the hub models the
pages name in an offline Hugging Face cache (their real config.json and safetensors
headers from tests/fixtures/hub), `./Llama-2-7b-hf/` as a downloaded folder and
`gpu-records/` holding 16 of the project's GPU records (a user's folder holds a few), and
`tests/measured/gpu/` the same 16 and every record a page names: `memspec validate
tests/measured/gpu` of measuring.md runs as written on them, and tests/test_measured_gate.py
validates all of them (the whole folder was 100 CPU seconds of the suite, estimated twice). The review page runs in a clone of this
repository, since `memspec diff` reads git. A command passes when it exits 0; one whose
comment says it exits with another code (`# exit 1` past a threshold, `# exit 4` when it
does not fit) may exit with that code too. tests/test_docs.py checks that
they parse; this file checks that they work.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hubfixtures as hf

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
HUB_MODELS = {"meta-llama/Llama-2-7b-hf": "Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B": "Qwen2.5-0.5B"}
MEMSPEC = f'"{sys.executable}" -m compiler.cli'


def steps(page: Path) -> list[tuple[str, str, str]]:
    """("write", path, text) for a YAML block headed `# path`, ("run", command, "") for each
    `memspec` line of a shell block (continuations joined), in the page's order."""
    out: list[tuple[str, str, str]] = []
    block: list[str] | None = None
    fence = ""
    for line in page.read_text().splitlines():
        if not line.startswith("```"):
            if block is not None:
                block.append(line)
            continue
        if block is None:
            block, fence = [], line[3:].strip()
            continue
        header = re.fullmatch(r"# (\S+\.ya?ml)", block[0]) if block else None
        if fence == "yaml" and header:
            out.append(("write", header.group(1), "\n".join(block[1:]) + "\n"))
        elif fence in ("", "sh", "bash"):
            for cmd in "\n".join(block).replace("\\\n", " ").splitlines():
                cmd = cmd.strip()
                if cmd.startswith("memspec ") and not re.match(r"memspec \w+:", cmd):
                    out.append(("run", cmd, ""))
        block = None
    return out


RUNNABLE = [p for p in PAGES if any(kind == "run" for kind, _, _ in steps(p))]


def _user_folder(tmp: Path, page: Path) -> Path:
    if page.name == "review-a-formula-change.md":
        work = tmp / "repo"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(work)], check=True)
        # `memspec diff` compares with main (or origin/main): both exist in the clone
        subprocess.run(["git", "-C", str(work), "branch", "--quiet", "-f", "main", "origin/main"], capture_output=True)
        return work
    work = tmp / "work"
    work.mkdir()
    shutil.copytree(ROOT / "specs", work / "specs")
    for name in ("formulas", "schemas", "docs"):
        (work / name).symlink_to(ROOT / name)
    # tests/ as the checkout's, but for tests/measured/gpu: GPU_SAMPLE
    gpu = ROOT / "tests" / "measured" / "gpu"
    for folder in (ROOT / "tests", ROOT / "tests" / "measured"):
        mirror = work / folder.relative_to(ROOT)
        mirror.mkdir()
        for child in folder.iterdir():
            if child not in (ROOT / "tests" / "measured", gpu):
                (mirror / child.name).symlink_to(child)
    (work / "tests" / "measured" / "gpu").mkdir()
    for record in GPU_SAMPLE:
        (work / "tests" / "measured" / "gpu" / record.name).symlink_to(record)
    return work


def _gpu_sample() -> tuple[list[Path], list[Path]]:
    """16 of the GPU records, spread over their names (a user's `gpu-records/`), and those with
    every one a page names (the folder's tests/measured/gpu)."""
    records = sorted((ROOT / "tests" / "measured" / "gpu").glob("*.json"))
    spread = records[:: len(records) // 16][:16]
    named = {m for page in PAGES for m in re.findall(r"tests/measured/gpu/([\w.\-]+\.json)", page.read_text())}
    return spread, sorted(set(spread) | {r for r in records if r.name in named})


GPU_SPREAD, GPU_SAMPLE = _gpu_sample()


def _environment(tmp: Path, work: Path) -> dict[str, str]:
    cache = tmp / "hf-cache"
    for repo, fixture in HUB_MODELS.items():
        hf.hub_cache(cache, repo, fixture)
    shutil.copytree(hf.FIXTURES / "Llama-2-7b-hf", work / "Llama-2-7b-hf")
    (work / "gpu-records").mkdir()
    for record in GPU_SPREAD:
        shutil.copy(record, work / "gpu-records")
    # NB: memspec's own cache is the test run's (conftest's _own_cache), as one user's commands
    # share theirs: what the measured gate and the other pages estimated is read back, not made
    # again (the pages took 145 s on their own caches, 127 s on one shared)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}


@pytest.mark.parametrize("page", RUNNABLE, ids=[p.relative_to(ROOT).as_posix() for p in RUNNABLE])
def test_page_runs_as_written(page, tmp_path):
    work = _user_folder(tmp_path, page)
    env = _environment(tmp_path, work)
    for kind, what, text in steps(page):
        if kind == "write":
            (work / what).parent.mkdir(parents=True, exist_ok=True)
            (work / what).write_text(text)
            continue
        out = subprocess.run(["bash", "-c", MEMSPEC + what[len("memspec") :]], cwd=work, env=env, capture_output=True, text=True)
        said = re.search(r"#.*\bexit (\d+)", what)
        allowed = (0, int(said.group(1))) if said else (0,)
        assert out.returncode in allowed, f"{page.name}: {what}\nexit {out.returncode}\n{out.stderr[-3000:]}"
