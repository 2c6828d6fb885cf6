"""The cache of checked inputs (compiler/checked.py): what it keeps, when it is used, and that
it never changes an answer: a hit, a miss, a changed file, a corrupt or unreadable entry and no
cache at all give the same estimate; a file with errors is reported every time."""

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import checked
from compiler.api import estimate
from compiler.errors import MemspecError
from compiler.pipeline.render import text

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = "specs/experiments/llava-1.5-7b-finetune.yaml"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of this test's own, and the in-process memos cleared."""
    from compiler import api
    from compiler.pipeline import resolve

    monkeypatch.setenv("MEMSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MEMSPEC_NO_CACHE", raising=False)
    monkeypatch.chdir(ROOT)
    api.library.cache_clear()
    resolve._catalog.cache_clear()
    resolve.gpu_catalog.cache_clear()
    yield tmp_path / "cache" / "checked"
    api.library.cache_clear()
    resolve._catalog.cache_clear()
    resolve.gpu_catalog.cache_clear()


def _fresh():
    from compiler import api
    from compiler.pipeline import resolve

    api.library.cache_clear()
    resolve._catalog.cache_clear()
    resolve.gpu_catalog.cache_clear()


def _answer():
    _fresh()
    return text(estimate(EXPERIMENT))


def test_miss_then_hit_same_answer(cache, monkeypatch):
    first = _answer()
    entries = sorted(cache.glob("*.pickle"))
    assert entries, "a miss keeps what it checked"
    stamps = {p: p.stat().st_mtime_ns for p in entries}
    loads = []
    real = checked.get
    monkeypatch.setattr(checked, "get", lambda name: loads.append(name) or real(name))
    assert _answer() == first
    assert loads and all(real(n) is not None for n in loads), "the second estimate reads every input from the cache"
    assert {p: p.stat().st_mtime_ns for p in sorted(cache.glob("*.pickle"))} == stamps, "a hit writes nothing"


def test_same_answer_without_cache(cache, monkeypatch):
    cached = _answer()
    monkeypatch.setenv("MEMSPEC_NO_CACHE", "1")
    assert _answer() == cached
    monkeypatch.delenv("MEMSPEC_NO_CACHE")
    assert _answer() == cached


def test_hit_skips_yaml_and_schema_checks(cache, monkeypatch):
    _answer()
    from compiler.pipeline import load, validate

    def refuse(*args, **kwargs):
        raise AssertionError("loaded or validated on a cache hit")

    monkeypatch.setattr(load, "load_yaml_text", refuse)
    monkeypatch.setattr(validate, "validate", refuse)
    _answer()


@pytest.mark.parametrize("damage", [b"", b"not a pickle", b"\x80\x05garbage", pickle.dumps({"some": "other value"})])
def test_corrupt_entries_are_made_again(cache, damage):
    first = _answer()
    for p in cache.glob("*.pickle"):
        p.write_bytes(damage)
    assert _answer() == first
    for p in cache.glob("*.pickle"):
        assert p.read_bytes() != damage, "a bad entry is replaced"


def test_unreadable_cache_folder_is_no_error(cache, monkeypatch, tmp_path):
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    monkeypatch.setenv("MEMSPEC_CACHE", str(blocker))
    assert _answer() == _answer()


def test_changed_file_is_a_new_key(cache, tmp_path):
    spec = tmp_path / "spec.yaml"
    source = (ROOT / "specs" / "qwen2" / "qwen2.5-0.5b.yaml").read_text()
    spec.write_text(source)
    _fresh()
    before = estimate(str(spec), micro_batch=1, seq_len=128, images_per_sample=0).allocated
    spec.write_text(source.replace("intermediate: 4864", "intermediate: 4800"))
    _fresh()
    with pytest.raises(MemspecError) as err:  # the parameter count no longer matches the header
        estimate(str(spec), micro_batch=1, seq_len=128, images_per_sample=0)
    assert "E502" in str(err.value.diagnostics[0].code)
    spec.write_text(source)
    _fresh()
    assert estimate(str(spec), micro_batch=1, seq_len=128, images_per_sample=0).allocated == before


def test_errors_are_never_cached(cache, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / EXPERIMENT).read_text().replace("micro_batch:", "micro_bach:"))
    for _ in range(2):
        _fresh()
        with pytest.raises(MemspecError) as err:
            estimate(str(bad))
        assert "micro_bach" in str(err.value.render())


def test_writes_are_atomic(cache, monkeypatch):
    """A value is written to a temporary file and moved into place: no half-written entry."""
    replaced = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: replaced.append((Path(a).name, Path(b).name)) or real(a, b))
    checked.put("k" * 40, {"x": 1})
    assert replaced and replaced[0][0].startswith(".tmp-") and replaced[0][1] == "k" * 40 + ".pickle"
    assert checked.get("k" * 40) == {"x": 1}
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]


def test_key_covers_kind_bytes_and_order():
    assert checked.key("document", "a", b"1") != checked.key("document", "a", b"2")
    assert checked.key("document", "a", b"1") != checked.key("spec", "a", b"1")
    assert checked.key("x", "ab", "c") != checked.key("x", "a", "bc")


def test_validate_comparison_cached(cache):
    from compiler.commands.validation import compare

    record = ROOT / "tests" / "measured" / "gpu"
    path = sorted(record.glob("*.json"))[0]
    first = compare(path)
    assert compare(path) == first
    for p in cache.glob("*.pickle"):
        p.write_bytes(b"junk")
    assert compare(path) == first


def test_progress_only_on_a_terminal_after_two_seconds(monkeypatch):
    from compiler.commands import progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    quiet = io.StringIO()
    p = progress.Progress(quiet, "validate", quiet_seconds=0)
    p(1, 3, "a")
    assert quiet.getvalue() == ""  # not a terminal: nothing
    tty = Tty()
    p = progress.Progress(tty, "validate")
    p(1, 3, "a")
    assert tty.getvalue() == ""  # under two seconds: nothing
    p.start -= progress.QUIET_SECONDS + 1
    p(2, 3, "record-b")
    assert "validate: [" in tty.getvalue() and "2/3 record-b" in tty.getvalue()
    p(3, 3, "")
    assert tty.getvalue().endswith("\r")  # the line is cleared at the end


def test_cli_estimate_twice_same_output(tmp_path):
    env = {**os.environ, "MEMSPEC_CACHE": str(tmp_path / "c"), "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "compiler.cli", "estimate", EXPERIMENT]
    outs = [subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, check=True) for _ in range(2)]
    assert outs[0].stdout == outs[1].stdout and outs[0].stderr == outs[1].stderr == ""
    assert list((tmp_path / "c" / "checked").glob("*.pickle"))


def test_check_and_validate_report_progress(monkeypatch):
    from compiler.commands.check import check_paths
    from compiler.commands.validation import validate_records

    monkeypatch.chdir(ROOT)
    # NB: 16 records across the families: enough for `processes.ordered` to fork on two CPUs
    gpu = sorted((ROOT / "tests" / "measured" / "gpu").glob("*.json"))
    records = gpu[:: len(gpu) // 16][:16]
    for run in (lambda p: check_paths([ROOT / "specs" / "experiments"], p), lambda p: validate_records(records, p)):
        calls = []
        run(lambda done, total, what, calls=calls: calls.append((done, total, what)))
        total = calls[0][1]
        assert total > 3 and [c[0] for c in calls] == list(range(total + 1))
        assert calls[-1] == (total, total, "") and all(c[2] for c in calls[:-1])


def test_progress_shows_on_a_terminal(tmp_path):
    """A long run under a terminal writes the progress line to stderr, then clears it."""
    import pty

    env = {**os.environ, "MEMSPEC_CACHE": str(tmp_path / "c"), "PYTHONPATH": str(ROOT)}
    code = (
        "import sys; from compiler.commands import progress; progress.QUIET_SECONDS = 0; "
        "from compiler.cli import main; sys.exit(main(['check', 'specs/experiments']))"
    )
    leader, follower = pty.openpty()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=follower, timeout=300)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.returncode == 0 and proc.stdout.startswith(b"ok: ")
    assert b"check: [" in seen and b"specs/experiments/" in seen


def test_tree_changes_with_any_data_file(tmp_path, monkeypatch):
    import shutil

    from compiler import paths

    for name in ("specs", "formulas", "schemas"):
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.setattr(paths, "data_root", lambda: tmp_path)
    before = checked.tree()
    assert checked.tree() == before
    linear = tmp_path / "formulas" / "linear.yaml"
    linear.write_text(linear.read_text() + "\n")
    assert checked.tree() != before


def _spec_files():
    return sorted(p for p in (ROOT / "specs").rglob("*.yaml") if p.parent.name not in ("experiments", "matrices", "families") and p.name != "gpus.yaml")


def test_validate_key_reaches_every_formula_an_estimate_loads(cache):
    """A record's comparison is kept by its spec and the formula files the spec reaches
    (commands/validation._reads); for every spec shipped, that set holds every layer type of
    the library its estimate loads (api.spec_library), so an edit to any of them makes the
    comparison anew. The LLaVA-1.5-7B spec's set, worked: its modules' types and their
    children, with linear's substitutes (LoRA, DoRA, 4- and 8-bit) and modules_to_save."""
    import json

    from compiler import api
    from compiler.commands import validation

    inputs = validation._Inputs.read()
    for spec_path in _spec_files():
        record = json.dumps({"experiment": {"model": str(spec_path.relative_to(ROOT))}}).encode()
        reads = validation._reads(record, inputs)
        assert reads is not None and reads[0] == str(spec_path.resolve())
        reached = set(reads[2::2])
        loaded = set(api.spec_library(api.load_spec(str(spec_path))).formulas)
        assert loaded <= reached, (spec_path, loaded - reached)
    llava = json.dumps({"experiment": {"model": "specs/llava/llava-1.5-7b.yaml"}}).encode()
    reached = set(validation._reads(llava, inputs)[2::2])
    assert {
        "clip_vision_tower",
        "mlp_projector",
        "llama_causal_lm",
        "llama_decoder_layer",
        "linear",
        "lora_linear",
        "dora_linear",
        "linear_4bit",
        "linear_8bit",
        "modules_to_save",
    } <= reached
    assert "gemma_attention" not in reached and "t5_stack" not in reached


def test_validate_remakes_only_the_records_an_edit_reaches(cache, tmp_path, monkeypatch):
    """After an edit to one formula file, `memspec validate` estimates again the records whose
    specs reach it and reads the others back: an edit to Gemma's attention leaves a LLaVA
    record's key alone and moves a Gemma 2 record's; an edit to linear moves both."""
    import shutil

    from compiler import paths
    from compiler.commands import validation

    for name in ("formulas", "schemas", "specs"):
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.setattr(paths, "data_root", lambda: tmp_path)
    llava = next((ROOT / "tests" / "measured" / "gpu").glob("llava-1.5_7b_proj_b4_*.json"))
    gemma = next((ROOT / "tests" / "measured" / "gpu").glob("gemma2_2b_*.json"))

    def keys():
        inputs = validation._Inputs.read()
        return validation._name(llava, inputs)[0], validation._name(gemma, inputs)[0]

    before = keys()
    assert keys() == before
    edited = tmp_path / "formulas" / "gemma_attention.yaml"
    edited.write_text(edited.read_text() + "\n")
    after_gemma = keys()
    assert after_gemma[0] == before[0] and after_gemma[1] != before[1]
    linear = tmp_path / "formulas" / "linear.yaml"
    linear.write_text(linear.read_text() + "\n")
    after_linear = keys()
    assert after_linear[0] != before[0] and after_linear[1] != after_gemma[1]


@pytest.fixture(scope="module")
def cache_of_a_module_fixture():
    from compiler import paths

    return paths.user_cache()


def test_a_module_fixture_uses_the_runs_cache_not_the_home_one(cache_of_a_module_fixture, tmp_path_factory):
    """A module-scoped fixture (the measured gate's estimates) is made before any
    function-scoped one: the run's cache must already be set, or the run reads and writes the
    user's home cache (and a warm one there hides the gate's cost)."""
    run = tmp_path_factory.getbasetemp()
    assert run.parent in cache_of_a_module_fixture.parents or run in cache_of_a_module_fixture.parents, cache_of_a_module_fixture
