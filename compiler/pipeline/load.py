"""Stage 1, load: a YAML file -> a `Document` (plain data + where every key and item is).

Contract:
- `load_yaml(path)` / `load_yaml_text(text, file)` return a frozen `Document` whose `data`
  holds only dict / list / str / int / float / bool / None, and whose `positions` maps the
  JSON path of every mapping key and sequence item to its 1-based (line, col), plus "$".
- Every problem of the file is collected, then raised as one `MemspecError`
  (codes E101-E110, see `compiler.errors`). Nothing prints.

The YAML is strict on purpose, because reviewed files must say what they mean:
- duplicate keys, anchors, aliases, merge keys (`<<`) and explicit tags are errors;
- mapping keys are strings;
- plain scalars follow the YAML 1.2 core schema, not PyYAML's YAML 1.1 one: `1e-4` is a
  float, `2024-01-01` a string, `1:20` a string; the YAML 1.1 booleans yes/no/on/off and
  numbers with a leading zero (octal in 1.1, decimal in 1.2) are errors, since the two
  readings disagree. Underscores in numbers (`7_063_427_072`) are allowed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from compiler.errors import Diagnostic, MemspecError
from compiler.pipeline.json_path import ancestors, child_path  # noqa: F401  (re-exported: callers take child_path from load)


# --------------------------------------------------------------------------- document


@dataclass(frozen=True)
class Document:
    """A loaded YAML file: plain data plus the position of every key and item."""

    file: str
    data: Any
    positions: Mapping[str, tuple[int, int]] = field(repr=False)

    def where(self, path: str) -> tuple[int, int]:
        """(line, col) of `path`, or of its nearest ancestor that has one; (0, 0) if none."""
        for candidate in ancestors(path):
            if candidate in self.positions:
                return self.positions[candidate]
        return (0, 0)

    def diag(self, code: str, path: str, message: str, help: str | None = None) -> Diagnostic:
        line, col = self.where(path)
        return Diagnostic(code, self.file, line, col, path, message, help)

    def __reduce__(self):
        # NB: a mappingproxy does not pickle; the checked-input cache keeps Documents
        return (_document, (self.file, self.data, dict(self.positions)))


def _document(file: str, data: Any, positions: dict[str, tuple[int, int]]) -> Document:
    return Document(file, data, MappingProxyType(positions))


def load_yaml(path: str | os.PathLike) -> Document:
    """Read and load one YAML file. `Document.file` is the path as given."""
    file = os.fspath(path)
    resolved = Path(file).resolve()
    if resolved.is_dir():
        raise MemspecError(Diagnostic("E101", file, 0, 0, "", "is a directory, not a file", f"give the path of a YAML file (in {resolved})"))
    try:
        raw = resolved.read_bytes()
    except FileNotFoundError:
        raise MemspecError(Diagnostic("E101", file, 0, 0, "", "file not found", f"looked for {resolved}")) from None
    except OSError as exc:
        raise MemspecError(Diagnostic("E101", file, 0, 0, "", f"cannot read file: {exc.strerror or exc}")) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        from .strict_yaml import _line_col

        before = raw[: exc.start].decode("utf-8", "replace")
        line, col = _line_col(before, len(before))
        raise MemspecError(Diagnostic("E102", file, line, col, "", "file is not valid UTF-8", "save the file as UTF-8")) from None
    return load_yaml_text(text, file)


def load_yaml_text(text: str, file: str) -> Document:
    """Load YAML from a string; `file` names it in diagnostics."""
    from .strict_yaml import _Builder, _compose_all, _is_empty, _unique  # NB: PyYAML only when a file is read

    problems: list[Diagnostic] = []
    roots = _compose_all(text, file, problems)
    if not problems and not roots:
        problems.append(Diagnostic("E106", file, 1, 1, "", "empty document", "a memspec file is a YAML mapping"))
    for start, _ in roots[1:2]:  # the second start is enough to find the stray separator
        problems.append(Diagnostic("E107", file, start[0], start[1], "", "more than one YAML document in the file", "put each document in its own file"))
    data: Any = None
    positions: dict[str, tuple[int, int]] = {"$": (1, 1)}
    if roots:
        root = roots[0][1]
        if _is_empty(root):
            problems.append(Diagnostic("E106", file, 1, 1, "", "empty document", "a memspec file is a YAML mapping"))
        else:
            data = _Builder(file, positions, problems).build(root, "$")
    if problems:
        raise MemspecError(_unique(problems))
    return Document(file, data, MappingProxyType(positions))
