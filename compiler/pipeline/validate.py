"""Stage 2, validate: a `Document` + a JSON Schema -> every violation, as located diagnostics.

Contract:
- `validate(doc, schema)` checks `doc.data` against `schema` (JSON Schema Draft 2020-12) and
  returns ALL violations as `Diagnostic`s (codes E201-E208, see `compiler.errors`), without
  duplicates, sorted by position. It returns instead of raising, so that a caller can merge
  them with its own checks before raising one `MemspecError`.
- Each diagnostic points at the offending key or item (`Document.where`); an unknown key is
  shown at that key, a missing one at the mapping that lacks it.
- `$ref` works within a schema and to the sibling files in `schemas/` by their `$id`.
- `load_schema(kind)` reads `schemas/<kind>.schema.json` under `paths.data_root()`, cached.
  NB: the cached dict is shared; treat it as read-only.
- `checked_document(path, kind)` is a file loaded and validated against its kind's schema
  (every violation raised as one `MemspecError`), kept in the checked-input cache
  (`compiler.checked`) by its bytes.

jsonschema is imported inside the functions that need it: estimating starts fast and only
pays for it when a file is checked.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from compiler import checked, paths
from compiler.errors import Diagnostic, MemspecError, did_you_mean
from compiler.pipeline.load import Document, child_path, load_yaml, load_yaml_text

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

# JSON Schema's type names, in the words of a YAML file's author.
_TYPE_NAMES = {"object": "mapping", "array": "list", "integer": "integer", "number": "number", "string": "string", "boolean": "boolean", "null": "null"}
_MAX_SHOWN = 40  # characters of a value quoted back in a message


def load_schema(kind: str) -> Mapping:
    """The schema for one file kind ("spec", "experiment", "formula", ...).

    NB: a missing or malformed schema file is a packaging bug, not a user error, so the
    OSError or json.JSONDecodeError propagates.
    """
    return _read_json(paths.schema_path(kind))


def validate(doc: Document, schema: Mapping) -> list[Diagnostic]:
    validator = _validator_class()(schema, registry=_registry(paths.schemas_dir()))
    found: dict[Diagnostic, None] = {}
    for error in validator.iter_errors(doc.data):
        for diagnostic in _diagnose(doc, error):
            found.setdefault(diagnostic)
    # NB: stable: diagnostics at one place keep jsonschema's order, which follows the schema.
    return sorted(found, key=lambda d: (d.line, d.col, d.path))


def check_loaded(data: Any, text: str, file: str, kind: str) -> None:
    """`data`, loaded from `text` without positions (json.loads), against the `kind` schema:
    nothing when it conforms, else every violation as a MemspecError with its line (`text`
    is loaded again with positions only then)."""
    if schema_validator(kind).is_valid(data):
        return
    problems = validate(load_yaml_text(text, file), load_schema(kind))
    if problems:
        raise MemspecError(problems)


@functools.lru_cache(maxsize=None)
def schema_validator(kind: str) -> Any:
    """The `kind` schema's validator, as every check of memspec applies it (`_validator_class`:
    an integer is a whole number written as one)."""
    return _validator_class()(load_schema(kind), registry=_registry(paths.schemas_dir()))


def checked_document(path: str | os.PathLike, kind: str | None) -> Document:
    """`load_yaml(path)` validated against the `kind` schema (None: loaded only), through the
    checked-input cache (`compiler.checked`); the Document names `path` as given."""
    file = os.fspath(path)
    raw = checked.read(file)
    name = checked.key("document", kind or "", file, raw) if raw is not None else None
    hit = checked.get(name) if name else None
    if isinstance(hit, tuple) and len(hit) == 2:
        return Document(file, hit[0], MappingProxyType(hit[1]))
    doc = load_yaml(file)
    if kind is not None:
        problems = validate(doc, load_schema(kind))
        if problems:
            raise MemspecError(problems)
    if name:
        checked.put(name, (doc.data, dict(doc.positions)))
    return doc


# --------------------------------------------------------------------------- schema loading


@functools.lru_cache(maxsize=None)
def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


@functools.lru_cache(maxsize=None)
def _schema_ids(directory: Path) -> Mapping[str, Path]:
    """`$id` -> file, for every `*.schema.json` in `directory`."""
    ids: dict[str, Path] = {}
    for file in sorted(directory.glob("*.schema.json")) if directory.is_dir() else ():
        contents = _read_json(file)
        if isinstance(contents, dict) and isinstance(contents.get("$id"), str):
            ids[contents["$id"].rstrip("#")] = file
    return ids


@functools.lru_cache(maxsize=None)
def _registry(directory: Path) -> Any:
    """A registry that fetches sibling schemas by `$id` only when a `$ref` needs one, so
    that a schema without external references never reads the folder."""
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource
    from referencing.jsonschema import DRAFT202012

    def retrieve(uri: str) -> Resource:
        file = _schema_ids(directory).get(uri.rstrip("#"))
        if file is None:
            raise NoSuchResource(ref=uri)
        return Resource.from_contents(_read_json(file), default_specification=DRAFT202012)

    return Registry(retrieve=retrieve)


@functools.lru_cache(maxsize=None)
def _validator_class() -> Any:
    """Draft 2020-12, except that `integer` means a whole number written as one.

    NB: plain Draft 2020-12 accepts 4096.0 as an integer; every size in memspec must be an
    exact int, so a float is reported here rather than turning byte counts into floats.
    """
    from jsonschema import Draft202012Validator, validators

    def is_integer(_checker: Any, instance: Any) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer)
    return validators.extend(Draft202012Validator, type_checker=checker)


# --------------------------------------------------------------------------- diagnosing


def _path_of(error: ValidationError) -> str:
    path = "$"
    for step in error.absolute_path:
        path = child_path(path, step)
    return path


def _diagnose(doc: Document, error: ValidationError) -> Iterator[Diagnostic]:
    """The diagnostics for one jsonschema error (one error may name several keys)."""
    keyword, path, value = error.validator, _path_of(error), error.instance
    if _in_property_names(error):
        yield doc.diag(*_about_key(error, path))
        return
    if keyword in ("additionalProperties", "unevaluatedProperties"):
        yield from _unknown_keys(doc, error, path)
    elif keyword == "required":
        for key in error.validator_value:
            if isinstance(value, dict) and key not in value:
                yield doc.diag("E201", path, f"missing required key '{key}'")
    elif keyword in ("oneOf", "anyOf") and error.context:
        yield from _diagnose(doc, _best_sub_error(error))
    elif keyword == "oneOf":
        yield doc.diag("E208", path, f"{_show(value)} matches more than one of the allowed forms", "the schema's oneOf needs exactly one")
    elif keyword == "uniqueItems":
        yield _duplicate_item(doc, value, path)
    else:
        code, message, help = _describe(keyword, error.validator_value, value, error.message)
        yield doc.diag(code, path, message, help)


def _best_sub_error(error: ValidationError) -> ValidationError:
    """The sub-error of a oneOf/anyOf that says most about what to fix.

    NB: not jsonschema's `best_match`, which at the top level prefers the branch whose
    `type` the value does NOT match (`-1` against `anyOf: [{type: integer, minimum: 1},
    {const: auto}]` would say "expected 'auto'" instead of "must be >= 1"). Preferred here,
    in order: the deepest error; one that is not a type mismatch; one from a branch whose
    declared type the value has; the first branch.
    """
    branches = error.validator_value if isinstance(error.validator_value, list) else []

    def rank(sub: ValidationError) -> tuple[int, bool, bool]:
        index = sub.relative_schema_path[0] if sub.relative_schema_path else None
        branch = branches[index] if isinstance(index, int) and index < len(branches) else {}
        declared = branch.get("type") if isinstance(branch, dict) else None
        return (len(sub.relative_path), sub.validator != "type", _has_type(error.instance, declared))

    return max(error.context, key=rank)


def _has_type(value: Any, declared: Any) -> bool:
    if declared is None:
        return False
    wanted = {declared} if isinstance(declared, str) else set(declared)
    kind = _json_type(value)
    return kind in wanted or (kind == "integer" and "number" in wanted)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _in_property_names(error: ValidationError) -> bool:
    return "propertyNames" in error.relative_schema_path or (error.parent is not None and _in_property_names(error.parent))


def _about_key(error: ValidationError, path: str) -> tuple[str, str, str, str | None]:
    """A `propertyNames` violation: the instance is the key itself, located at the key."""
    key = str(error.instance)
    code, message, help = _describe(error.validator, error.validator_value, key, error.message)
    return code, child_path(path, key), f"key {message}", help


def _unknown_keys(doc: Document, error: ValidationError, path: str) -> Iterator[Diagnostic]:
    instance = error.instance if isinstance(error.instance, dict) else {}
    allowed = _known_keys(error.schema, deep=error.validator == "unevaluatedProperties")
    if error.validator == "additionalProperties":
        unknown = [key for key in instance if key not in allowed and not _matches_patterns(error.schema, key)]
    else:
        # NB: which keys the other keywords evaluated is known only to jsonschema; its message
        # lists the unexpected ones by repr.
        unknown = [key for key in instance if repr(key) in error.message]
    for key in unknown:
        help = did_you_mean(key, allowed)
        if help is None and allowed:
            help = "allowed keys: " + ", ".join(allowed)
        yield doc.diag("E203", child_path(path, key), f"unknown key '{key}'", help)


def _known_keys(schema: Any, deep: bool) -> list[str]:
    """The keys `schema` declares; with `deep`, also those of its in-place subschemas
    (allOf/anyOf/oneOf), which `unevaluatedProperties` counts as evaluated."""
    if not isinstance(schema, dict):
        return []
    keys = list(schema.get("properties", {}))
    for keyword in ("allOf", "anyOf", "oneOf") if deep else ():
        for sub in schema.get(keyword, []):
            keys += [key for key in _known_keys(sub, deep) if key not in keys]
    return keys


def _matches_patterns(schema: Any, key: str) -> bool:
    patterns = schema.get("patternProperties", {}) if isinstance(schema, dict) else {}
    return any(re.search(pattern, key) for pattern in patterns)


def _duplicate_item(doc: Document, items: Any, path: str) -> Diagnostic:
    """uniqueItems, located at the first repeated item."""
    seen: list[Any] = []
    for index, item in enumerate(items if isinstance(items, list) else []):
        if any(_same(item, other) for other in seen):
            return doc.diag("E207", child_path(path, index), f"items must be unique: {_show(item)} appears more than once")
        seen.append(item)
    return doc.diag("E207", path, "items must be unique")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b  # JSON equality: true is not 1
    return a == b


def _describe(keyword: str | None, expected: Any, value: Any, fallback: str) -> tuple[str, str, str | None]:
    """(code, message, help) for a single-value violation."""
    if keyword == "type":
        wanted = [expected] if isinstance(expected, str) else list(expected)
        names = " or ".join(_TYPE_NAMES.get(name, name) for name in wanted)
        return "E202", f"expected {names}, got {_kind_and_value(value)}", None
    if keyword in _BOUNDS:
        return "E204", f"must be {_BOUNDS[keyword]} {_show(expected)}, got {_show(value)}", None
    if keyword == "multipleOf":
        return "E204", f"must be a multiple of {_show(expected)}, got {_show(value)}", None
    if keyword == "enum":
        choices = ", ".join(_plain(choice) for choice in expected)
        return "E205", f"{_show(value)} is not one of: {choices}", _suggest(value, expected)
    if keyword == "const":
        return "E205", f"expected {_show(expected)}, got {_show(value)}", _suggest(value, [expected])
    if keyword == "pattern":
        return "E206", f"{_show(value)} does not match pattern '{expected}'", None
    if keyword in ("minLength", "maxLength"):
        bound = "at least" if keyword == "minLength" else "at most"
        return "E206", f"must have {bound} {expected} character(s), got {len(value)}", None
    if keyword in _SIZES:
        bound, unit = _SIZES[keyword]
        return "E207", f"must have {bound} {expected} {unit}(s), got {len(value)}", None
    return "E208", fallback, None


_BOUNDS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
_SIZES = {"minItems": ("at least", "item"), "maxItems": ("at most", "item"), "minProperties": ("at least", "key"), "maxProperties": ("at most", "key")}


def _suggest(value: Any, choices: Iterable[Any]) -> str | None:
    if not isinstance(value, str):
        return None
    return did_you_mean(value, [choice for choice in choices if isinstance(choice, str)])


def _kind_and_value(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {_show(value)}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {_show(value)}"
    return _show(value)


def _show(value: Any) -> str:
    """A value as a YAML author would recognise it: 'text', 12, true, null, a mapping."""
    if isinstance(value, str):
        return _plain(value if len(value) <= _MAX_SHOWN else value[: _MAX_SHOWN - 3] + "...", quote=True)
    return _plain(value)


def _plain(value: Any, quote: bool = False) -> str:
    if isinstance(value, str):
        return f"'{value}'" if quote else value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)
