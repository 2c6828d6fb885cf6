"""Where the data files live.

Contract: `data_root()` is the folder holding `schemas/`, `specs/` and `formulas/`: the
`compiler/_data/` folder a wheel ships, else the repository root of a checkout (or an
editable install). Every other module asks here instead of building paths itself.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_root() -> Path:
    bundled = _PACKAGE / "_data"
    return bundled if bundled.is_dir() else _PACKAGE.parent


def schemas_dir() -> Path:
    return data_root() / "schemas"


def schema_path(kind: str) -> Path:
    """`schemas/<kind>.schema.json`, e.g. kind "spec", "experiment", "formula"."""
    return schemas_dir() / f"{kind}.schema.json"


def formulas_dir() -> Path:
    return data_root() / "formulas"


def specs_dir() -> Path:
    return data_root() / "specs"


def families_dir() -> Path:
    """`specs/families/`: one Hugging Face family mapping per file, read by `memspec import`."""
    return specs_dir() / "families"


def user_cache() -> Path:
    """memspec's own cache: `$MEMSPEC_CACHE`, else `$XDG_CACHE_HOME/memspec`, else `~/.cache/memspec`."""
    import os

    root = os.environ.get("MEMSPEC_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memspec")
    return Path(root)


def display(path: Path) -> str:
    """A path as messages show it: relative to the working directory when below it, else as
    given (errors and record names read better)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
