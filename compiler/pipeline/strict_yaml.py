"""Stage 1, load, the YAML half: PyYAML's events composed into nodes strictly, and the nodes
built into plain data with the position of every key and item (see `load.py`, which imports
this module only when a file is actually read: a cached input needs no PyYAML).
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from yaml.events import AliasEvent, DocumentStartEvent, ScalarEvent, StreamEndEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from compiler.errors import Diagnostic
from compiler.pipeline.json_path import child_path

_TAG = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL = (_TAG + t for t in ("str", "int", "float", "bool", "null"))
MERGE = _TAG + "merge"
SEQ, MAP = _TAG + "seq", _TAG + "map"
# Private tags for plain scalars that are reported instead of converted.
_AMBIGUOUS_BOOL = "tag:memspec,2024:ambiguous-bool"
_AMBIGUOUS_INT = "tag:memspec,2024:ambiguous-int"
_ALIAS = "tag:memspec,2024:alias"

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution) plus underscores
# in numbers, which PyYAML and Python both accept. One alternation, first group wins.
_PLAIN_RULES = re.compile(
    "|".join(
        f"(?P<{name}>{rule})"
        for name, rule in (
            ("null", r"(?:~|null|Null|NULL|)\Z"),
            ("bool", r"(?:true|True|TRUE|false|False|FALSE)\Z"),
            ("ambiguous_bool", r"(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF)\Z"),
            ("ambiguous_int", r"[-+]?0[0-9_]*[0-9][0-9_]*\Z"),
            ("int", r"[-+]?[0-9][0-9_]*\Z|0x[0-9a-fA-F_]+\Z|0o[0-7_]+\Z"),
            (
                "float",
                r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?\Z"
                r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+\Z"
                r"|[-+]?\.(?:inf|Inf|INF)\Z|\.(?:nan|NaN|NAN)\Z",
            ),
            ("merge", r"<<\Z"),
        )
    )
)
_RULE_TAGS = {"null": NULL, "bool": BOOL, "ambiguous_bool": _AMBIGUOUS_BOOL, "ambiguous_int": _AMBIGUOUS_INT, "int": INT, "float": FLOAT, "merge": MERGE}
# Plain scalars starting with any other character are strings; checking that first keeps
# loading fast, since most scalars are names.
_RULE_FIRST = frozenset("~nNtTfFyYoO0123456789+-.<")

_NO_ANCHORS_HELP = "write the value out in full: anchors and aliases hide what a reviewed file says"

# --------------------------------------------------------------------------- composing

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Nesting any memspec file needs is under ten levels; a deeper one is refused (E102) before
# Python's recursion limit turns it into a crash.
MAX_DEPTH = 100
# NB: putting `Composer` first makes its Python `compose_node` win over the C composer of
# `CSafeLoader`; the pure-Python `SafeLoader` has it already.
_LOADER_BASES = (_BaseLoader,) if issubclass(_BaseLoader, yaml.composer.Composer) else (yaml.composer.Composer, _BaseLoader)


class _StrictLoader(*_LOADER_BASES):  # type: ignore[misc]
    """Events from libyaml when available; nodes composed in Python so that anchors,
    aliases and explicit tags are recorded on the node (for a located error) instead of
    being resolved silently."""

    def __init__(self, stream: str):
        _BaseLoader.__init__(self, stream)
        self.anchors = {}
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if type(event) is ScalarEvent and event.anchor is None and event.tag is None:
            # NB: the common case, inlined: it is most of the nodes of a file.
            self.get_event()
            tag = _plain_tag(event.value) if event.implicit[0] else STR
            return ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        if isinstance(event, AliasEvent):
            self.get_event()
            return ScalarNode(_ALIAS, event.anchor, event.start_mark, event.end_mark)
        anchor, event.anchor = event.anchor, None  # never registered: aliases are refused
        tag = getattr(event, "tag", None)
        if self.depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"lists and mappings nested deeper than {MAX_DEPTH} levels", event.start_mark)
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if anchor is not None:
            node.memspec_anchor = anchor
        if tag not in (None, "!"):
            node.memspec_tag = tag
        return node

    def resolve(self, kind: type, value: Any, implicit: Any) -> str:
        if kind is ScalarNode:
            return _plain_tag(value) if implicit[0] else STR
        return SEQ if kind is SequenceNode else MAP


def _plain_tag(value: str) -> str:
    if value and value[0] not in _RULE_FIRST:
        return STR
    found = _PLAIN_RULES.match(value)
    return _RULE_TAGS[found.lastgroup] if found else STR


def _compose_all(text: str, file: str, problems: list[Diagnostic]) -> list[tuple[tuple[int, int], Node]]:
    """Root node of each document with the position of its start; a syntax error stops
    composing and becomes an E102 in `problems`."""
    roots: list[tuple[tuple[int, int], Node]] = []
    loader = None
    try:
        loader = _StrictLoader(text)  # NB: the pure-Python reader checks characters here
        loader.get_event()  # StreamStartEvent
        while not loader.check_event(StreamEndEvent):
            start = loader.peek_event()
            assert isinstance(start, DocumentStartEvent)
            roots.append((_position(start.start_mark), loader.compose_document()))
    except yaml.MarkedYAMLError as exc:
        problems.append(_syntax_diagnostic(exc, file, text))
    except yaml.reader.ReaderError as exc:
        line, col = _line_col(text, exc.position)
        problems.append(Diagnostic("E102", file, line, col, "", _reader_message(exc)))
    finally:
        if loader is not None:
            loader.dispose()
    return roots


def _syntax_diagnostic(exc: yaml.MarkedYAMLError, file: str, text: str) -> Diagnostic:
    mark = exc.problem_mark or exc.context_mark
    line, col = _position(mark) if mark else (0, 0)
    message = exc.problem or exc.context or "invalid YAML"
    help = None
    if exc.context and exc.problem:
        help = exc.context
        if exc.context_mark is not None and exc.context_mark is not mark:
            help += f" at line {exc.context_mark.line + 1}"
    if mark is not None and "\t" in _line_text(text, mark.line)[: mark.column + 1]:
        help = "indent with spaces, not tabs"
    return Diagnostic("E102", file, line, col, "", message, help)


def _reader_message(exc: yaml.reader.ReaderError) -> str:
    if isinstance(exc.character, int):
        return f"unacceptable character #x{exc.character:04x}: {exc.reason}"
    return str(exc.reason)


def _line_text(text: str, index: int) -> str:
    lines = text.split("\n", index + 1)
    return lines[index] if index < len(lines) else ""


def _position(mark: yaml.Mark) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


def _line_col(text: str, index: int) -> tuple[int, int]:
    before = text[:index]
    return (before.count("\n") + 1, index - (before.rfind("\n") + 1) + 1)


def _is_empty(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == NULL and node.value == "" and not node.style


def _unique(problems: list[Diagnostic]) -> list[Diagnostic]:
    return list(dict.fromkeys(problems))


# --------------------------------------------------------------------------- building


class _Builder:
    """Nodes -> plain data, filling `positions` and appending to `problems` as it goes."""

    def __init__(self, file: str, positions: dict[str, tuple[int, int]], problems: list[Diagnostic]):
        self.file, self.positions, self.problems = file, positions, problems

    def report(self, code: str, node: Node, path: str, message: str, help: str | None = None) -> None:
        line, col = _position(node.start_mark)
        self.problems.append(Diagnostic(code, self.file, line, col, path, message, help))

    def build(self, node: Node, path: str) -> Any:
        anchor = getattr(node, "memspec_anchor", None)
        if anchor is not None:
            self.report("E104", node, path, f"anchor '&{anchor}' is not allowed", _NO_ANCHORS_HELP)
        tag = getattr(node, "memspec_tag", None)
        if tag is not None:
            shown = "!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else tag
            self.report("E110", node, path, f"tag '{shown}' is not allowed", "remove the tag; quote the value if it must be a string")
            return None
        if isinstance(node, MappingNode):
            return self.mapping(node, path)
        if isinstance(node, SequenceNode):
            return self.sequence(node, path)
        return self.scalar(node, path)

    def sequence(self, node: SequenceNode, path: str) -> list[Any]:
        items = []
        for index, item in enumerate(node.value):
            item_path = child_path(path, index)
            self.positions[item_path] = _position(item.start_mark)
            items.append(self.build(item, item_path))
        return items

    def mapping(self, node: MappingNode, path: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = self.key(key_node, path)
            if key is None:
                continue
            key_path = child_path(path, key)
            if key in first_line:
                self.report("E103", key_node, key_path, f"duplicate key '{key}'", f"first defined at line {first_line[key]}")
                continue
            first_line[key] = key_node.start_mark.line + 1
            self.positions[key_path] = _position(key_node.start_mark)
            result[key] = self.build(value_node, key_path)
        return result

    def key(self, node: Node, path: str) -> str | None:
        """The key as a string, or None after reporting why it is not one."""
        if getattr(node, "memspec_tag", None) is not None or getattr(node, "memspec_anchor", None):
            self.build(node, path)  # reports the tag or anchor
            return None
        if not isinstance(node, ScalarNode):
            self.report("E105", node, path, "mapping keys must be strings, not a " + ("mapping" if isinstance(node, MappingNode) else "list"))
            return None
        if node.tag == _ALIAS:
            self.report("E104", node, path, f"alias '*{node.value}' is not allowed", _NO_ANCHORS_HELP)
            return None
        if node.tag == MERGE:
            self.report("E104", node, path, "merge key '<<' is not allowed", _NO_ANCHORS_HELP)
            return None
        if node.tag == _AMBIGUOUS_BOOL:
            self.report("E108", node, path, f"ambiguous boolean '{node.value}'", f"quote it if the key is the string '{node.value}'")
            return None
        if node.tag != STR:
            shown = node.value if node.value else "null"
            self.report("E105", node, path, f"mapping key {shown} is not a string", f"quote it if you mean the string: '{node.value}'")
            return None
        return node.value

    def scalar(self, node: ScalarNode, path: str) -> Any:
        tag, value = node.tag, node.value
        if tag == STR or tag == MERGE:
            return value
        if tag == NULL:
            return None
        if tag == BOOL:
            return value.lower() == "true"
        if tag == INT:
            return _to_int(value)
        if tag == FLOAT:
            return _to_float(value)
        if tag == _ALIAS:
            self.report("E104", node, path, f"alias '*{value}' is not allowed", _NO_ANCHORS_HELP)
        elif tag == _AMBIGUOUS_BOOL:
            self.report("E108", node, path, f"ambiguous boolean '{value}'", "write true or false")
        elif tag == _AMBIGUOUS_INT:
            self.report("E109", node, path, f"ambiguous number '{value}'", "YAML 1.1 reads a leading zero as octal: remove it, or quote the value")
        return None


def _to_int(text: str) -> int:
    digits = text.replace("_", "")
    if digits.startswith(("0x", "0o")):
        return int(digits, 0)
    return int(digits)


def _to_float(text: str) -> float:
    lowered = text.replace("_", "").lower()
    if lowered.endswith(".inf"):
        return -math.inf if lowered.startswith("-") else math.inf
    if lowered == ".nan":
        return math.nan
    return float(lowered)
