"""A cache of checked inputs: files loaded, validated against their schema and compiled once,
kept by content.

Contract: `key(kind, *parts)` names a value by everything it is made from, `get(name)` and
`put(name, value)` read and keep it; the stages keep theirs here: `validate.checked_document(path,
kind)` (`load_yaml(path)` validated against `schemas/<kind>.schema.json`),
`resolve.checked_spec(path)` (that for a model spec, resolved) and
`library(folder, files, types, build, kind)` (`build()`, the linked formula library, for
`library.formula.load_library`). This module imports no stage. Each answer is the same value
the uncached stages give, kept under `paths.user_cache()/checked/` by a blake2b hash of everything it was made
from: the file's bytes (every formula file of the folder for a library), the path as the
messages name it, the schemas, memspec's version and the source of the modules that make the
value. A changed byte anywhere is a new key; nothing is ever invalidated in place.

`tree()` hashes the whole package and its data for values that depend on everything, `code()`
the package and the schemas alone (a measured record's estimate, `memspec validate`, adds the
spec and formula files it reads).

Only inputs without problems are kept: a file with errors is loaded and reported every time.
Writes are atomic (a temporary file, then `os.replace`), and an entry that cannot be read or
unpickled is ignored and made again: the cache can only cost time, never an answer.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any, Callable, Iterable

from . import paths

VERSION = "0.1.0"  # NB: pyproject.toml's [project] version
# The modules whose code makes a cached value: a change to any of them is a new key.
_MAKERS = (
    "checked.py",
    "paths.py",
    "errors.py",
    "pipeline/load.py",
    "pipeline/json_path.py",
    "pipeline/strict_yaml.py",
    "pipeline/validate.py",
    "pipeline/vocabulary.py",
    "pipeline/gpus.py",
    "pipeline/zero_config.py",
    "pipeline/resolve.py",
    "pipeline/placement.py",
    "library/formula.py",
    "library/expr_python.py",
    "library/grammar.py",
)
_PACKAGE = Path(__file__).resolve().parent
_FINGERPRINTS: dict[Path, bytes] = {}  # by schemas folder
# Off when MEMSPEC_NO_CACHE is set (to a non-empty value): every input loaded and checked anew.
_OFF = "MEMSPEC_NO_CACHE"


def folder() -> Path:
    return paths.user_cache() / "checked"


def _fingerprint() -> bytes:
    """memspec's version, the schemas and the code that makes cached values."""
    schemas = paths.schemas_dir()
    found = _FINGERPRINTS.get(schemas)
    if found is None:
        h = hashlib.blake2b(VERSION.encode(), digest_size=20)
        for name in _MAKERS:
            h.update(name.encode() + b"\0" + (_PACKAGE / name).read_bytes())
        for file in sorted(schemas.glob("*.schema.json")) if schemas.is_dir() else ():
            h.update(file.name.encode() + b"\0" + file.read_bytes())
        found = _FINGERPRINTS[schemas] = h.digest()
    return found


def tree() -> bytes:
    """A hash of everything an estimate reads: every file of the compiler package and of the
    data folders (specs, formulas, schemas), read anew at each call. Any edit anywhere makes
    a value keyed by it anew."""
    root = paths.data_root()
    return _hash((_PACKAGE, root / "specs", root / "formulas", root / "schemas"))


def code() -> bytes:
    """A hash of the compiler package and the schemas, read anew at each call: what every
    estimate depends on, whichever spec and formula files it reads (validate's comparisons
    add those, `commands.validation`)."""
    return _hash((_PACKAGE, paths.data_root() / "schemas"))


def _hash(tops) -> bytes:
    h = hashlib.blake2b(_fingerprint(), digest_size=20)
    for top in tops:
        h.update(Path(top).name.encode() + b"\0")
        for directory, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "_data"))
            for file in sorted(files):
                if file.endswith((".pyc", ".pickle")):
                    continue
                full = os.path.join(directory, file)
                h.update(os.path.relpath(full, top).encode() + b"\0")
                try:
                    with open(full, "rb") as handle:
                        h.update(handle.read())
                except OSError:
                    h.update(b"\1unreadable")
    return h.digest()


def key(kind: str, *parts: bytes | str) -> str:
    h = hashlib.blake2b(_fingerprint(), digest_size=20)
    h.update(kind.encode())
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def enabled() -> bool:
    return not os.environ.get(_OFF)


def get(name: str) -> Any | None:
    """The value kept under `name`, or None when there is none or it cannot be read."""
    if not enabled():
        return None
    try:
        with open(folder() / f"{name}.pickle", "rb") as handle:
            return pickle.load(handle)
    except Exception:  # NB: missing, truncated, corrupt, from an incompatible class: made again
        return None


def put(name: str, value: Any) -> None:
    """Keep `value` under `name`; a cache that cannot be written is skipped silently."""
    if not enabled():
        return
    target = folder() / f"{name}.pickle"
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        import tempfile

        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".pickle")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)
        tmp = None
    except Exception:  # NB: a read-only or full disk, a value that does not pickle
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def read(path: str | os.PathLike) -> bytes | None:
    """The bytes of `path` a key is made from; None when it cannot be read."""
    try:
        return Path(os.fspath(path)).resolve().read_bytes()
    except OSError:
        return None  # NB: load_yaml says what is wrong (not found, a directory, unreadable)


def library(folder: str | os.PathLike, files: Iterable[Path], types: Iterable[str] | None, build: Callable[[], Any], kind: type):
    """The formula library `build()` makes from `files` (every formula file of `folder`), for
    the layer types `types` (None: all); a kept value that is no `kind` is made again."""
    parts: list[bytes | str] = [os.fspath(folder), os.getcwd(), "\0".join(sorted(types)) if types is not None else "\0all"]
    for file in files:
        raw = read(file)
        if raw is None:
            return build()
        parts += [file.name, raw]
    name = key("library", *parts)
    hit = get(name)
    if isinstance(hit, kind):
        return hit
    value = build()
    put(name, value)
    return value
