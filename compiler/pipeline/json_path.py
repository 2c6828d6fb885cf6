"""JSON paths as memspec's diagnostics write them (`$.modules.language`, `$.trainable[0]`,
`$['a b']`): the path of a key under its parent, and a path's ancestors. Part of stage 1,
load; plain strings, no PyYAML.
"""

from __future__ import annotations

import re

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PATH_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]")


def child_path(parent: str, key: str | int) -> str:
    """JSON path of `key` under `parent`: `$.modules`, `$.trainable[0]`, `$['a b']`."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{parent}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{parent}['{escaped}']"


def ancestors(path: str) -> list[str]:
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
