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
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from compiler.errors import Diagnostic, MemspecError

_TAG = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
MERGE = _TAG + "merge"
SEQ, MAP = _TAG + "seq", _TAG + "map"
# Private tags for plain scalars that are reported instead of converted.
_AMBIGUOUS_BOOL = "tag:memspec,2024:ambiguous-bool"
_AMBIGUOUS_INT = "tag:memspec,2024:ambiguous-int"
_ALIAS = "tag:memspec,2024:alias"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PATH_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]")

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution) plus underscores
# in numbers, which PyYAML and Python both accept. One alternation, first group wins.
_PLAIN_RULES = re.compile("|".join(f"(?P<{name}>{rule})" for name, rule in (
    ("null", r"(?:~|null|Null|NULL|)\Z"),
    ("bool", r"(?:true|True|TRUE|false|False|FALSE)\Z"),
    ("ambiguous_bool", r"(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)\Z"),
    ("ambiguous_int", r"[-+]?0[0-9_]*[0-9][0-9_]*\Z"),
    ("int", r"[-+]?[0-9][0-9_]*\Z|0x[0-9a-fA-F_]+\Z|0o[0-7_]+\Z"),
    ("float", r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?\Z"
              r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+\Z"
              r"|[-+]?\.(?:inf|Inf|INF)\Z|\.(?:nan|NaN|NAN)\Z"),
    ("merge", r"<<\Z"),
)))
_RULE_TAGS = {"null": NULL, "bool": BOOL, "ambiguous_bool": _AMBIGUOUS_BOOL,
              "ambiguous_int": _AMBIGUOUS_INT, "int": INT, "float": FLOAT, "merge": MERGE}
# Plain scalars starting with any other character are strings; checking that first keeps
# loading fast, since most scalars are names.
_RULE_FIRST = frozenset("~nNtTfFyYoO0123456789+-.<")

_NO_ANCHORS_HELP = "write the value out in full: anchors and aliases hide what a reviewed file says"


# --------------------------------------------------------------------------- paths

def child_path(parent: str, key: str | int) -> str:
    """JSON path of `key` under `parent`: `$.modules`, `$.trainable[0]`, `$['a b']`."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{parent}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{parent}['{escaped}']"


def _ancestors(path: str) -> list[str]:
    """`path` and each of its ancestors, longest first, down to "$"."""
    if not path.startswith("$"):
        return ["$"]
    prefixes, end = ["$"], 1
    for step in _PATH_STEP.finditer(path, 1):
        if step.start() != end:
            break  # NB: malformed tail; fall back to the prefix parsed so far
        end = step.end()
        prefixes.append(path[:end])
    return prefixes[::-1]


# --------------------------------------------------------------------------- document

@dataclass(frozen=True)
class Document:
    """A loaded YAML file: plain data plus the position of every key and item."""

    file: str
    data: Any
    positions: Mapping[str, tuple[int, int]] = field(repr=False)

    def where(self, path: str) -> tuple[int, int]:
        """(line, col) of `path`, or of its nearest ancestor that has one; (0, 0) if none."""
        for candidate in _ancestors(path):
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
        raise MemspecError(Diagnostic(
            "E101", file, 0, 0, "", "is a directory, not a file",
            f"give the path of a YAML file (in {resolved})"))
    try:
        raw = resolved.read_bytes()
    except FileNotFoundError:
        raise MemspecError(Diagnostic(
            "E101", file, 0, 0, "", "file not found", f"looked for {resolved}")) from None
    except OSError as exc:
        raise MemspecError(Diagnostic(
            "E101", file, 0, 0, "", f"cannot read file: {exc.strerror or exc}")) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        from .strict_yaml import _line_col

        before = raw[: exc.start].decode("utf-8", "replace")
        line, col = _line_col(before, len(before))
        raise MemspecError(Diagnostic(
            "E102", file, line, col, "", "file is not valid UTF-8",
            "save the file as UTF-8")) from None
    return load_yaml_text(text, file)


def load_yaml_text(text: str, file: str) -> Document:
    """Load YAML from a string; `file` names it in diagnostics."""
    from .strict_yaml import _Builder, _compose_all, _is_empty, _unique  # NB: PyYAML only when a file is read

    problems: list[Diagnostic] = []
    roots = _compose_all(text, file, problems)
    if not problems and not roots:
        problems.append(Diagnostic("E106", file, 1, 1, "", "empty document",
                                   "a memspec file is a YAML mapping"))
    for start, _ in roots[1:2]:  # the second start is enough to find the stray separator
        problems.append(Diagnostic("E107", file, start[0], start[1], "",
                                   "more than one YAML document in the file",
                                   "put each document in its own file"))
    data: Any = None
    positions: dict[str, tuple[int, int]] = {"$": (1, 1)}
    if roots:
        root = roots[0][1]
        if _is_empty(root):
            problems.append(Diagnostic("E106", file, 1, 1, "", "empty document",
                                       "a memspec file is a YAML mapping"))
        else:
            data = _Builder(file, positions, problems).build(root, "$")
    if problems:
        raise MemspecError(_unique(problems))
    return Document(file, data, MappingProxyType(positions))
