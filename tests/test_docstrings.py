"""The code's comments and docstrings name what exists: every backticked reference to a
memspec module's attribute (`resolve.resolve_setup`, `compiler.paths.display`) resolves, and
every backticked `name.py` is a file of the package."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "compiler"
REFERENCE = re.compile(r"`((?:compiler\.)?[A-Za-z_]+(?:\.[A-Za-z_]+)+)(?:\(\))?`")


def _modules() -> dict[str, list[str]]:
    """A module's last name -> its dotted names (two modules may share a last name)."""
    out: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.setdefault(path.stem, []).append(dotted)
    return out


def _resolves(module: str, attributes: list[str]) -> bool:
    obj = importlib.import_module(module)
    for name in attributes:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def _references():
    for path in sorted(PACKAGE.rglob("*.py")):
        for match in REFERENCE.finditer(path.read_text(encoding="utf-8")):
            yield path.relative_to(ROOT).as_posix(), match.group(1)


def test_backticked_references_resolve():
    modules, files = _modules(), {p.name for p in PACKAGE.rglob("*.py")}
    broken = []
    for where, ref in _references():
        parts = ref.split(".")
        if parts[-1] == "py":
            if ref not in files:
                broken.append((where, ref))
        elif parts[0] == "compiler":
            for i in range(len(parts), 1, -1):
                try:
                    ok = _resolves(".".join(parts[:i]), parts[i:])
                except ImportError:
                    continue
                break
            else:
                ok = False
            if not ok:
                broken.append((where, ref))
        elif parts[0] in modules and not any(_resolves(m, parts[1:]) for m in modules[parts[0]]):
            broken.append((where, ref))
    assert broken == []


@pytest.mark.parametrize("ref", ["resolve.no_such_function", "compiler.paths.nowhere"])
def test_a_broken_reference_is_caught(ref):
    parts = ref.split(".")
    if parts[0] == "compiler":
        assert not _resolves("compiler.paths", ["nowhere"])
    else:
        assert not any(_resolves(m, parts[1:]) for m in _modules()[parts[0]])
