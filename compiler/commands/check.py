"""`memspec check`: every spec, experiment and formula under the given paths, all errors at once.

Contract: `check_paths(paths)` returns (files checked, diagnostics). The formula library is
always checked, examples included, because every spec depends on it. Specs are compiled with
one sample and the shortest sequence their images allow, so that a parameter count that
disagrees with the formulas is found without an experiment. Files are checked in forked
processes when there are many (`processes.ordered`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import Diagnostic, MemspecError
from ..pipeline.load import load_yaml
from ..paths import display, formulas_dir


def _yaml_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(q for q in p.rglob("*.yaml") if q.is_file()))
        else:
            files.append(p)
    return files


def check_paths(paths: list[Path], progress=None) -> tuple[list[str], list[Diagnostic]]:
    """`progress(done, total, name)`, when given, is called before each file and once at the end."""
    from .. import api
    from .processes import ordered

    problems: list[Diagnostic] = []
    checked: list[str] = []
    library = None
    try:
        library = api.library(str(formulas_dir()))
        problems.extend(_shipped_examples(library))
    except MemspecError as exc:
        problems.extend(exc.diagnostics)
    files = _yaml_files(paths)
    found = ordered(_check_file, [(path, library is not None) for path in files])
    for i, path in enumerate(files):
        name = display(path)
        if progress is not None:
            progress(i, len(files), name)
        checked.append(name)
        problems.extend(next(found))
    if progress is not None:
        progress(len(files), len(files), "")
    unique = list(dict.fromkeys(problems))
    return checked, unique


def _shipped_examples(library) -> list[Diagnostic]:
    """The built-in library's worked examples run (`run_examples`), or none where every one
    passed before on the same formula files and code: the answer is kept in the checked-input
    cache (compiler/checked.py), keyed by the package, the schemas and every formula file's
    bytes. A check of one spec ran the library's 334 examples each time (2.6 s of its 3)."""
    from .. import checked
    from ..library.examples import run_examples

    folder = formulas_dir()
    name = checked.key("examples", checked.code(), *(f.name.encode() + b"\0" + f.read_bytes() for f in sorted(folder.glob("*.yaml"))))
    if checked.get(name) is True:
        return []
    problems = run_examples(library)
    if not problems:
        checked.put(name, True)
    return problems


def _check_file(item: tuple[Path, bool]) -> list[Diagnostic]:
    """The problems of one file (`item`: its path, and whether the shipped library loaded)."""
    from .. import api
    from ..library.examples import run_examples

    path, has_library = item
    name = display(path)
    if path.resolve().parent == formulas_dir().resolve():
        return []  # checked with the library, first
    try:
        kind = api.file_kind(load_yaml(name))
        if kind == "formula":
            from ..library.formula import load_library

            return list(run_examples(load_library(path.parent)))  # a formula folder other than the built-in one
        if kind == "gpus":
            api.gpu_catalog()
        elif kind == "matrix":
            pass  # a measuring plan: read by `memspec measure --matrix`, which checks it
        elif kind == "family":
            _check_family(name)
        elif has_library:
            _compile(name, kind, api.library(str(formulas_dir())))
    except MemspecError as exc:
        return list(exc.diagnostics)
    return []


def _check_family(name: str) -> None:
    """An import mapping: its schema, and every expression compiled against its config names."""
    from ..inputs.family import load_family

    load_family(name)


# A bare spec is checked at micro-batch 1 and the shortest sequence that holds its images; the
# first expansion that counts them gets this many positions (fit's search bound).
PROBE_SEQ = 1 << 20


def _compile(name: str, kind: str, library) -> None:
    from .. import api

    if kind == "experiment":
        spec, setup = api.load_inputs(name)
    else:
        spec = api.load_spec(name)
        # NB: the image tokens at the spec's default image size (tiles, native resolution) can
        # exceed spec.image_tokens; a first expansion with room for any of them counts them. A
        # model whose formulas splice the features without an image_merge (Qwen-VL's remote
        # code) takes the spec's own count, as resolve checks it
        _, probe = api.load_inputs(name, {"micro_batch": 1, "seq_len": PROBE_SEQ})
        need = api.image_tokens_per_sample(api.layers(spec, probe, library))
        if need is None:
            need = probe.images_per_sample * spec.image_tokens
        _, setup = api.load_inputs(name, {"micro_batch": 1, "seq_len": max(need, 1)})
    # NB: a check needs no figure: with a budget of 0 bytes the step's allocated peak is past it
    # and the caching allocator's replay, two thirds of an estimate's time, is left out
    # (simulate's `verdict_budget`); everything the files decide (expansion, the formulas,
    # the parameter count, the step's walk) still runs
    api.run(spec, setup, library, verdict_budget=0)
